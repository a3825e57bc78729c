"""The install script `GET /reef/harness/install` serves, for `curl ... | sh`.

It is meant to be read before it is run: it says what it will write, then writes one file, the
`reef-agent` wrapper (reef/surfaces/agent_wrapper.sh), copied verbatim from a quoted here-document,
so nothing in it is expanded or evaluated. The only values Reef bakes in (its URL, the adapter,
the default scenario, the agent's folders) are checked against strict patterns first and then
written inside single quotes, so no value can carry a quote, a newline or a `$`.

Its URL is the `url` the client asks for, else the configured `public_url`, else the address
the request came to. That last one comes from the request's Host header, which the client (or
anyone in between) chooses: set `public_url` when Reef sits behind a proxy or a cache.
"""

from __future__ import annotations

import re
from importlib import resources

from reef.core.errors import InvalidInput
from reef.core.urls import checked_url
from reef.surfaces.agent_layout import BLOCK_BEGIN, BLOCK_END, EXTENSIONS_DIR, Adapter
from reef.surfaces.codex_config import codex_sections

_UNQUOTABLE = re.compile(r"['\\\n\r\0]")
_HEREDOC_END = "REEF_AGENT_WRAPPER_EOF"


def server_url(asked: str | None, public_url: str | None, scheme: str, host_header: str | None) -> str:
    """The URL an install script names: the `url` the client asked for, else the configured
    `public_url`, else the address the request came to (its Host header, so checked as strictly)."""
    if asked:
        return checked_url(asked)
    if public_url:
        return public_url
    try:
        return checked_url(f"{scheme}://{host_header}")
    except InvalidInput:
        raise InvalidInput(
            f"the request's Host header ({host_header!r}) is not a plain host[:port]; "
            "pass url=http://host[:port], or set public_url in Reef's settings"
        ) from None


def _quoted(value: str) -> str:
    if _UNQUOTABLE.search(value):
        raise InvalidInput(f"cannot bake {value!r} into a shell script")
    return f"'{value}'"


def wrapper_script(adapter: Adapter, url: str, scenario: str) -> str:
    values = {
        "@ADAPTER@": adapter.name,
        "@URL@": checked_url(url),
        "@SCENARIO@": scenario,
        "@MEMORY_FILE@": adapter.memory_file,
        "@SKILLS_DIR@": adapter.skills_dir,
        "@COMMAND@": adapter.command,
        "@BLOCK_BEGIN@": BLOCK_BEGIN,
        "@BLOCK_END@": BLOCK_END,
        "@EXTENSIONS_DIR@": EXTENSIONS_DIR,
    }
    text = resources.files("reef.surfaces").joinpath("agent_wrapper.sh").read_text(encoding="utf-8")
    for placeholder, value in values.items():
        text = text.replace(placeholder, _quoted(value))
    assert _HEREDOC_END not in text and not re.search(r"@[A-Z_]+@", text) and text.endswith("\n")
    return text


def install_script(adapter: Adapter, url: str, scenario: str) -> str:
    wrapper = wrapper_script(adapter, url, scenario)
    base = checked_url(url)
    # Codex CLI ignores OPENAI_BASE_URL: its config gets a provider pointing at Reef
    codex_announce, codex_write = codex_sections(base) if adapter.name == "codex" else ("", "")
    writes = (
        f"{adapter.memory_file} (only the block between Reef's marker lines), "
        f"{adapter.skills_dir}/reef-*/SKILL.md and {EXTENSIONS_DIR}/"
    )
    return f"""#!/bin/sh
# Reef agent installer: adapter {adapter.name}, Reef at {base}, default scenario {scenario}.
#
# Read it before you run it. It writes exactly one file, the reef-agent wrapper that follows
# verbatim below (a quoted here-document: nothing in it is expanded), into
# ${{REEF_AGENT_BIN:-$HOME/.local/bin}}/${{REEF_AGENT_NAME:-reef-agent}}.
# Set REEF_AGENT_DRY_RUN=1 (or pass --dry-run: sh -s -- --dry-run) to see what it would write
# and write nothing.
set -eu
if [ "${{1:-}}" = --dry-run ]; then REEF_AGENT_DRY_RUN=1; fi

adapter={_quoted(adapter.name)}
reef_url={_quoted(base)}
name=${{REEF_AGENT_NAME:-reef-agent}}
case $name in
  ''|-*|*[!A-Za-z0-9._-]*) echo "REEF_AGENT_NAME must be a plain file name" >&2; exit 1 ;;
esac
bin_dir=${{REEF_AGENT_BIN:-${{HOME:?HOME is not set}}/.local/bin}}
target=$bin_dir/$name

echo "Reef agent installer (adapter $adapter, Reef at $reef_url)"
echo "It will write: $target (the reef-agent wrapper, mode 755)"
echo "Each run of $name then writes, in the directory you run it in:"
echo "  {writes}"
echo "and remembers the session in ${{REEF_AGENT_HOME:-$HOME/.reef-agent}}/."
{codex_announce}if [ -n "${{REEF_AGENT_DRY_RUN:-}}" ]; then
  echo "REEF_AGENT_DRY_RUN is set: nothing was written."
  exit 0
fi

mkdir -p -- "$bin_dir"
tmp=$(mktemp "$bin_dir/.$name.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp" <<'{_HEREDOC_END}'
{wrapper}{_HEREDOC_END}
chmod 755 "$tmp"
mv -f -- "$tmp" "$target"
trap - EXIT
echo "Installed $target"
{codex_write}case ":$PATH:" in
  *":$bin_dir:"*) ;;
  *) echo "Note: $bin_dir is not on your PATH; add it, or run $target directly." ;;
esac
echo "Use it: export REEF_TOKEN=...; cd your-project; $name [agent arguments]"
echo "Then:   $name report --score 0 --feedback 'what went wrong'"
"""
