#!/bin/sh
# reef-agent: runs a coding agent through Reef with the current harness of its scenario.
#
#   reef-agent [AGENT ARGUMENTS...]       pull the harness, then run the agent through Reef
#   reef-agent -- [AGENT ARGUMENTS...]    the same, for arguments that start with report/pull/session
#   reef-agent pull                       only pull the harness into this directory
#   reef-agent report --score X [--feedback TEXT] [--session ID]
#                                         report on the last session (or on ID)
#   reef-agent session                    print the last session id
#
# Environment: REEF_TOKEN (the Reef token), REEF_URL and REEF_SCENARIO (override the values
# below), REEF_AGENT_COMMAND (the agent executable), REEF_AGENT_HOME (default ~/.reef-agent).
#
# What each run writes, in the directory it runs in: the block between Reef's marker lines in
# the agent's memory file (the rest of the file is left as it is), Reef-owned skill folders
# (reef-*, marked by a .reef-owned file; other folders are never touched) and the extensions
# folder. The harness arrives as a tar archive; every path in it is checked (plain characters,
# relative, no '..', inside those folders, regular files only) before anything is written, and
# nothing is written through a link that leads outside the project (a memory file, skills or
# extensions folder, or any folder above them, that is a symbolic link to elsewhere): the run
# stops instead. Nothing the server sends is ever evaluated as shell code.
set -eu

ADAPTER=@ADAPTER@
DEFAULT_URL=@URL@
DEFAULT_SCENARIO=@SCENARIO@
MEMORY_FILE=@MEMORY_FILE@
SKILLS_DIR=@SKILLS_DIR@
AGENT_COMMAND=@COMMAND@
BLOCK_BEGIN=@BLOCK_BEGIN@
BLOCK_END=@BLOCK_END@
EXTENSIONS_DIR=@EXTENSIONS_DIR@

say() { printf 'reef-agent: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
printable() { printf '%s' "$1" | LC_ALL=C tr -cd '[:print:]' | head -c 300; }

url=${REEF_URL:-$DEFAULT_URL}
url=${url%/}
scenario=${REEF_SCENARIO:-$DEFAULT_SCENARIO}
token=${REEF_TOKEN:-}
state_dir=${REEF_AGENT_HOME:-${HOME:?HOME is not set}/.reef-agent}

case $url in
  http://*|https://*) ;;
  *) die "REEF_URL must start with http:// or https://" ;;
esac
case $url in
  *[!A-Za-z0-9:/._~-]*) die "REEF_URL may hold only letters, digits and : / . _ ~ -" ;;
esac
check_scenario() {
  case $1 in
    ''|[!A-Za-z0-9]*|*[!A-Za-z0-9._-]*|*..*) die "a scenario name is letters, digits, '.', '_' and '-': $(printable "$1")" ;;
  esac
}
check_scenario "$scenario"
case $token in
  *[!A-Za-z0-9._~+/=:-]*) die "REEF_TOKEN may hold only letters, digits and . _ ~ + / = : -" ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/reef-agent.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
# The token goes to curl in a private file, never on its command line (visible to `ps`).
(umask 077 && printf 'Authorization: Bearer %s\n' "$token" > "$work/auth")

# reef_http OUT URL [CURL ARGS...]: prints the HTTP status; the body goes to OUT.
reef_http() {
  out=$1
  target=$2
  shift 2
  if [ -n "$token" ]; then
    set -- -H "@$work/auth" "$@"
  fi
  curl -sS -o "$out" -D "$work/response-headers" -w '%{http_code}' --connect-timeout 10 --max-time 300 \
    --max-filesize 67108864 -H "x-reef-scenario: $scenario" "$@" "$target" || die "cannot reach Reef at $url"
}

header_value() {
  awk -v want="$1" 'BEGIN { FS = ":" } tolower($1) == want { sub(/^[^:]*:[ \t]*/, ""); print; exit }' \
    "$work/response-headers" | LC_ALL=C tr -cd 'A-Za-z0-9._:-'
}

# -- pulling the harness ---------------------------------------------------------------------

check_path() {
  case $1 in
    ''|/*|-*|*..*|*//*|*[!A-Za-z0-9._/-]*)
      die "refused the harness: unsafe path '$(printable "$1")'; nothing was written" ;;
  esac
  case $1 in
    reef-block.md) ;;
    "$SKILLS_DIR"/reef-?*/?*) ;;
    "$EXTENSIONS_DIR"/?*) ;;
    *) die "refused the harness: '$1' is outside $MEMORY_FILE, $SKILLS_DIR/reef-* and $EXTENSIONS_DIR; nothing was written" ;;
  esac
}

check_archive() {
  tar -tvf "$1" > "$work/members" 2>/dev/null || die "refused the harness: not a readable tar archive"
  tar -tf "$1" > "$work/names" 2>/dev/null || die "refused the harness: not a readable tar archive"
  if grep -v '^-' "$work/members" > /dev/null; then
    die "refused the harness: it holds something other than regular files (a link, a folder, a device); nothing was written"
  fi
  while IFS= read -r name; do
    check_path "$name"
  done < "$work/names"
  grep -qxF reef-block.md "$work/names" || die "refused the harness: it has no reef-block.md"
}

# -- staying inside the project -------------------------------------------------------------------

project=$(pwd -P)

resolve() {
  if command -v realpath > /dev/null 2>&1; then realpath -- "$1" 2> /dev/null; else readlink -f -- "$1" 2> /dev/null; fi
}

# outside_link PATH: prints the first part of PATH (relative to the project) that is a symbolic link
# resolving outside the project (or not resolving at all), and succeeds; fails if there is none.
outside_link() {
  part=
  rest=$1
  while [ -n "$rest" ]; do
    part=${part:+$part/}${rest%%/*}
    case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
    if [ -L "$part" ]; then
      case $(resolve "$part" || true) in
        "$project"|"$project"/*) ;;
        *) printf '%s' "$part"; return 0 ;;
      esac
    fi
  done
  return 1
}

# Every path a pull writes or removes: the memory file, the folders, each file of the archive.
check_inside() {
  { printf '%s\n' "$MEMORY_FILE" "$SKILLS_DIR" "$EXTENSIONS_DIR"; grep -vxF reef-block.md "$1" || true; } > "$work/targets"
  while IFS= read -r path; do
    if link=$(outside_link "$path"); then
      die "refused to write $path: $link is a symbolic link to $(printable "$(resolve "$link" || echo 'nowhere')"), outside this project ($(printable "$project")); nothing was written"
    fi
  done < "$work/targets"
}

is_reef_skill() {
  [ -d "$1" ] && [ ! -L "$1" ] && [ -f "$1/.reef-owned" ]
}

install_files() {
  if [ -d "$SKILLS_DIR" ]; then
    for dir in "$SKILLS_DIR"/reef-*; do
      if is_reef_skill "$dir"; then rm -rf -- "$dir"; fi
    done
  fi
  rm -rf -- "$EXTENSIONS_DIR"
  while IFS= read -r name; do
    case $name in
      reef-block.md) continue ;;
      "$SKILLS_DIR"/*)
        folder=${name#"$SKILLS_DIR"/}
        folder=$SKILLS_DIR/${folder%%/*}
        if [ -e "$folder" ] && ! is_reef_skill "$folder"; then
          say "left $folder alone: it exists and is not Reef's"
          continue
        fi
        mkdir -p -- "$folder"
        : > "$folder/.reef-owned" ;;
    esac
    mkdir -p -- "$(dirname -- "$name")"
    cat -- "$work/stage/$name" > "$name"
  done < "$work/names"
}

write_block() {
  block=$1
  file=$MEMORY_FILE
  begins=0
  if [ -f "$file" ]; then
    begins=$(grep -cxF -e "$BLOCK_BEGIN" -- "$file" || true)
    ends=$(grep -cxF -e "$BLOCK_END" -- "$file" || true)
    first_begin=$(grep -nxF -e "$BLOCK_BEGIN" -- "$file" | head -n 1 | cut -d: -f1)
    first_end=$(grep -nxF -e "$BLOCK_END" -- "$file" | head -n 1 | cut -d: -f1)
    if [ "$begins" != "$ends" ] || [ "$begins" -gt 1 ] || { [ "$begins" = 1 ] && [ "$first_begin" -gt "$first_end" ]; }; then
      say "$file has stray Reef marker lines; left it as it is (remove them and run again)"
      return 0
    fi
  fi
  tmp=$work/memory-file
  if [ "$begins" = 1 ]; then
    REEF_BEGIN=$BLOCK_BEGIN REEF_END=$BLOCK_END REEF_BLOCK=$block awk '
      BEGIN { b = ENVIRON["REEF_BEGIN"]; e = ENVIRON["REEF_END"]; f = ENVIRON["REEF_BLOCK"] }
      $0 == b { print b; while ((getline line < f) > 0) print line; print e; skip = 1; next }
      skip && $0 == e { skip = 0; next }
      !skip { print }' "$file" > "$tmp"
  else
    {
      if [ -s "$file" ]; then cat -- "$file"; printf '\n'; fi
      printf '%s\n' "$BLOCK_BEGIN"
      grep -vxF -e "$BLOCK_BEGIN" -e "$BLOCK_END" -- "$block" || true
      printf '%s\n' "$BLOCK_END"
    } > "$tmp"
  fi
  cat -- "$tmp" > "$file"  # in place: the file keeps its mode, owner and links
}

pull_harness() {
  code=$(reef_http "$work/harness.tar" "$url/reef/harness/files?adapter=$ADAPTER&scenario=$scenario")
  case $code in
    200) ;;
    404) say "scenario $scenario has no harness yet; your files are left as they are"; return 0 ;;
    *) die "Reef answered $code to the harness request: $(printable "$(head -c 400 "$work/harness.tar")")" ;;
  esac
  check_archive "$work/harness.tar"
  check_inside "$work/names"
  mkdir "$work/stage"
  tar -xf "$work/harness.tar" -C "$work/stage" || die "could not unpack the harness"
  grep -vxF -e "$BLOCK_BEGIN" -e "$BLOCK_END" -- "$work/stage/reef-block.md" > "$work/block" || true
  install_files
  write_block "$work/block"
  say "harness of scenario $scenario, release $(header_value x-reef-release-id), written to $MEMORY_FILE and $SKILLS_DIR/reef-*"
}

# -- sessions and reports ----------------------------------------------------------------------

new_session() {
  od -An -N16 -tx1 /dev/urandom | tr -d ' \n'
}

remember_session() {
  mkdir -p -- "$state_dir"
  printf '%s\n' "$1" > "$state_dir/last-session"
  printf '%s\n' "$scenario" > "$state_dir/last-scenario"
}

# Sets sid (and scenario, unless REEF_SCENARIO says otherwise) to the last run's.
load_last_session() {
  [ -f "$state_dir/last-session" ] || die "no session yet: run the agent through reef-agent first, or pass --session ID"
  IFS= read -r sid < "$state_dir/last-session" || true
  if [ -z "${REEF_SCENARIO:-}" ] && [ -f "$state_dir/last-scenario" ]; then
    IFS= read -r scenario < "$state_dir/last-scenario" || true
    check_scenario "$scenario"
  fi
}

check_session() {
  case $1 in
    ''|[!A-Za-z0-9]*|*[!A-Za-z0-9._:-]*|*..*) die "a session id is letters, digits, '.', '_', ':' and '-': $(printable "$1")" ;;
  esac
}

# JSON string contents for any text: backslash, quote and control characters escaped.
json_escape() {
  printf '%s\n' "$1" | LC_ALL=C awk '
    BEGIN { for (i = 1; i < 32; i++) ctl[sprintf("%c", i)] = sprintf("\\u%04x", i) }
    { out = ""; n = length($0)
      for (i = 1; i <= n; i++) {
        c = substr($0, i, 1)
        if (c == "\\") c = "\\\\"; else if (c == "\"") c = "\\\""; else if (c in ctl) c = ctl[c]
        out = out c
      }
      printf "%s%s", (NR > 1 ? "\\n" : ""), out }'
}

report() {
  score=
  feedback=
  has_feedback=
  sid=
  while [ $# -gt 0 ]; do
    case $1 in
      --score) [ $# -ge 2 ] || die "--score needs a value"; score=$2; shift 2 ;;
      --score=*) score=${1#--score=}; shift ;;
      --feedback) [ $# -ge 2 ] || die "--feedback needs a value"; feedback=$2; has_feedback=1; shift 2 ;;
      --feedback=*) feedback=${1#--feedback=}; has_feedback=1; shift ;;
      --session) [ $# -ge 2 ] || die "--session needs a value"; sid=$2; shift 2 ;;
      --session=*) sid=${1#--session=}; shift ;;
      *) die "report takes --score X [--feedback TEXT] [--session ID], not '$(printable "$1")'" ;;
    esac
  done
  case $score in
    ''|*[!0-9eE.+-]*) die "--score needs a number, got '$(printable "$score")'" ;;
  esac
  printf '%s' "$score" | grep -Eqx -e '-?(0|[1-9][0-9]*)([.][0-9]+)?([eE][-+]?[0-9]+)?' || die "--score needs a number, got '$score'"
  if [ -z "$sid" ]; then load_last_session; fi
  check_session "$sid"
  {
    printf '{"session":"%s","score":%s' "$sid" "$score"
    if [ -n "$has_feedback" ]; then
      printf ',"feedback":"'
      json_escape "$feedback"
      printf '"'
    fi
    printf ',"metadata":{"via":"reef-agent","adapter":"%s"}}' "$ADAPTER"
  } > "$work/report.json"
  code=$(reef_http "$work/answer" "$url/reef/report" -H 'content-type: application/json' --data-binary "@$work/report.json")
  case $code in
    2??) say "reported score $score on session $sid (scenario $scenario)"; cat -- "$work/answer"; echo ;;
    *) die "Reef answered $code to the report: $(printable "$(head -c 400 "$work/answer")")" ;;
  esac
}

# -- running the agent ---------------------------------------------------------------------------

write_pi_extension() {
  mkdir -p -- "$state_dir"
  cat > "$state_dir/pi-reef-provider.ts" <<'EOF'
// Written by reef-agent on every run: routes pi's requests through Reef.
// The values come from the environment reef-agent sets; apiKey names the variable that holds the token.
export default function (pi: any) {
  const env = process.env;
  pi.registerProvider("reef", {
    baseUrl: env.REEF_OPENAI_BASE_URL,
    apiKey: "REEF_TOKEN",
    api: "openai-completions",
    headers: { "x-reef-scenario": env.REEF_SCENARIO ?? "default", "x-reef-session": env.REEF_SESSION ?? "" },
    models: [{ id: "reef", name: "Reef", reasoning: false, input: ["text"],
               cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 128000, maxTokens: 16384 }],
  });
}
EOF
}

point_agent_at_reef() {
  session=$1
  export REEF_URL="$url" REEF_SCENARIO="$scenario" REEF_SESSION="$session" REEF_TOKEN="${token:-none}"
  export REEF_OPENAI_BASE_URL="$url/v1"
  case $ADAPTER in
    claude)
      unset ANTHROPIC_API_KEY  # Claude Code would send it as x-api-key, to Reef
      export ANTHROPIC_BASE_URL="$url" ANTHROPIC_AUTH_TOKEN="${token:-none}"
      headers="x-reef-scenario: $scenario
x-reef-session: $session"
      others=$(printf '%s\n' "${ANTHROPIC_CUSTOM_HEADERS:-}" | grep -viE '^x-reef-(scenario|session):' || true)
      if [ -n "$others" ]; then headers="$others
$headers"; fi
      export ANTHROPIC_CUSTOM_HEADERS="$headers" ;;
    *)
      export OPENAI_BASE_URL="$url/v1" OPENAI_API_KEY="${token:-none}" ;;
  esac
  if [ "$ADAPTER" = opencode ]; then
    if [ -n "${OPENCODE_CONFIG_CONTENT:-}" ]; then say "OPENCODE_CONFIG_CONTENT is replaced by Reef's provider for this run"; fi
    # Every value here passed the character checks above: no quote or backslash can occur.
    export OPENCODE_CONFIG_CONTENT="{\"provider\":{\"reef\":{\"npm\":\"@ai-sdk/openai-compatible\",\"name\":\"Reef\",\"options\":{\"baseURL\":\"$url/v1\",\"apiKey\":\"${token:-none}\",\"headers\":{\"x-reef-scenario\":\"$scenario\",\"x-reef-session\":\"$session\"}},\"models\":{\"reef\":{\"name\":\"Reef ($scenario)\"}}}},\"model\":\"reef/reef\"}"
  fi
}

run_agent() {
  command=${REEF_AGENT_COMMAND:-$AGENT_COMMAND}
  if [ -z "$command" ]; then
    [ $# -ge 1 ] || die "name the agent to run: reef-agent -- COMMAND [ARGUMENTS...]"
    command=$1
    shift
  fi
  command -v "$command" > /dev/null 2>&1 || die "agent '$(printable "$command")' not found (set REEF_AGENT_COMMAND)"
  pull_harness
  session=$(new_session)
  remember_session "$session"
  point_agent_at_reef "$session"
  if [ "$ADAPTER" = pi ]; then
    write_pi_extension
    set -- --extension "$state_dir/pi-reef-provider.ts" --provider reef --model reef "$@"
  fi
  if [ "$ADAPTER" = codex ]; then  # the provider the install script added to Codex's config.toml
    set -- -c model_provider=reef -c model=reef "$@"
  fi
  say "session $session (scenario $scenario); report on it with: reef-agent report --score X --feedback TEXT"
  rm -rf -- "$work"
  trap - EXIT
  exec "$command" "$@"
}

case ${1:-} in
  report) shift; report "$@" ;;
  pull) shift; pull_harness ;;
  session) load_last_session; printf '%s\n' "$sid" ;;
  --) shift; run_agent "$@" ;;
  *) run_agent "$@" ;;
esac
