"""Codex CLI's side of the install script: a model provider pointing at Reef in Codex's config.

Codex reads no OPENAI_BASE_URL; it calls the provider its config names. The install script for
the `codex` adapter therefore adds `[model_providers.reef]` (Reef's `/v1`, the Responses API, the
token from REEF_TOKEN, the scenario and session from REEF_SCENARIO and REEF_SESSION when set) to
`$CODEX_HOME/config.toml` (default `~/.codex`): between Reef's marker lines, replacing only an
earlier such block and keeping the rest of the file, after copying the file to a dated backup.
When the file already defines that provider outside the block, the script stops before it
writes anything. It also writes the profile `$CODEX_HOME/reef.config.toml`, so `codex --profile reef` goes
through Reef; `reef-agent` passes `-c model_provider=reef` itself. Every value baked in passed
`checked_url` or the scenario-name check, so none can carry a quote or a newline.
"""

from __future__ import annotations

from reef.core.urls import checked_url

BEGIN = "# reef:codex-provider:begin (written by the Reef install script; replaced when it runs again)"
END = "# reef:codex-provider:end"
_TEXT_END = "REEF_CODEX_EOF"


def provider_block(url: str) -> str:
    """The TOML between Reef's marker lines in config.toml."""
    return (
        f"{BEGIN}\n"
        "[model_providers.reef]\n"
        'name = "Reef"\n'
        f'base_url = "{checked_url(url)}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "REEF_TOKEN"  # any value when Reef has no token\n'
        'env_http_headers = { "x-reef-scenario" = "REEF_SCENARIO", "x-reef-session" = "REEF_SESSION" }\n'
        f"{END}\n"
    )


PROFILE = '# Written by the Reef install script: `codex --profile reef` goes through Reef.\nmodel_provider = "reef"\nmodel = "reef"\n'


def _text(text: str) -> str:
    assert _TEXT_END not in text and text.endswith("\n")
    return f"<<'{_TEXT_END}'\n{text}{_TEXT_END}"


def announce(url: str) -> str:
    """Shell lines saying what the script will change in Codex's config (shown on a dry run too);
    they stop the script, before anything is written, when the config defines the provider itself."""
    return f"""codex_home=${{CODEX_HOME:-$HOME/.codex}}
codex_config=$codex_home/config.toml
begin='{BEGIN}'
end='{END}'
if [ -f "$codex_config" ] && awk -v b="$begin" -v e="$end" '
  $0 == b {{ inside = 1 }} $0 == e {{ inside = 0 }}
  !inside && /^[ \\t]*\\[[ \\t]*model_providers[ \\t]*\\.[ \\t]*"?reef"?[ \\t]*\\]/ {{ found = 1 }}
  END {{ exit !found }}' "$codex_config"; then
  echo "$codex_config already defines [model_providers.reef] outside Reef's block: remove it, then run this again" >&2
  exit 1
fi
echo "It will add Reef's model provider to $codex_config (Codex ignores OPENAI_BASE_URL),"
echo "replacing only an earlier block between Reef's marker lines, after a dated backup of the file:"
cat {_text(provider_block(url))}
echo "and write the profile $codex_home/reef.config.toml (codex --profile reef goes through Reef):"
cat {_text(PROFILE)}
"""


def write(url: str) -> str:
    """Shell lines that merge the provider block into config.toml and write the profile."""
    return f"""mkdir -p -- "$codex_home"
codex_tmp=$(mktemp "$codex_home/.config.toml.XXXXXX")
trap 'rm -f -- "$codex_tmp"' EXIT
if [ -f "$codex_config" ]; then
  backup=$codex_config.reef-backup-$(date +%Y%m%d-%H%M%S)
  cp -p -- "$codex_config" "$backup"
  echo "Backed up $codex_config to $backup"
  awk -v b="$begin" -v e="$end" '$0 == b {{ inside = 1; next }} $0 == e {{ inside = 0; next }} !inside' \\
    "$codex_config" > "$codex_tmp"
fi
cat >> "$codex_tmp" {_text(provider_block(url))}
mv -f -- "$codex_tmp" "$codex_config"
trap - EXIT
cat > "$codex_home/reef.config.toml" {_text(PROFILE)}
echo "Added Reef's model provider to $codex_config and wrote $codex_home/reef.config.toml"
"""


def codex_sections(url: str) -> tuple[str, str]:
    """(what the script announces, what it then writes) for the `codex` adapter."""
    return announce(url), write(url)
