#!/usr/bin/env bash
# A newcomer's first hour, verbatim: clone this checkout's HEAD into a fresh directory and run the
# README's quick-start commands exactly as the README states them, then the first example.
#
#   tools/newcomer_check.sh                 # every quick-start command (make demo, make test, ...)
#   tools/newcomer_check.sh demo            # only the quick-start commands whose text contains "demo"
#   KEEP=1 tools/newcomer_check.sh          # keep the clone (its path is printed) to look around
#
# The commands are read from the README's first ```bash block under "## Quick start", so the check
# cannot drift from what the README tells people to type. Exit status: the first failing command's.
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
only=${1:-}
clone=$(mktemp -d /tmp/psrl-newcomer.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$clone"' EXIT

quick_start_commands() {
  # the first fenced bash block after the Quick start heading, comments stripped
  awk '/^## Quick start/{q=1} q&&/^```bash/{b=1;next} b&&/^```/{exit} b' "$repo/README.md" |
    sed -e 's/[[:space:]]*#.*$//' -e '/^[[:space:]]*$/d'
}

git clone -q "$repo" "$clone/psrl"
cd "$clone/psrl"
echo "newcomer check in $clone/psrl at $(git rev-parse --short HEAD)"

mapfile -t commands < <(quick_start_commands)
[ ${#commands[@]} -gt 0 ] || { echo "no commands found under the README's Quick start" >&2; exit 2; }
ran=0
for command in "${commands[@]}"; do
  [[ -z "$only" || "$command" == *"$only"* ]] || continue
  echo "+ $command"
  start=$SECONDS
  bash -c "$command"
  echo "  ok in $((SECONDS - start)) s"
  ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "no quick-start command matches '$only'" >&2; exit 2; }

if [[ -z "$only" || "$only" == example* ]]; then
  # the README's first example, as its section states it (the venv exists after make demo/test)
  echo "+ .venv/bin/psrl launch examples/digits/config.yaml"
  .venv/bin/psrl launch examples/digits/config.yaml
fi
echo "RESULT newcomer_commands=$ran ok=1"
