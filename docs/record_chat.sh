#!/usr/bin/env bash
# Regenerate docs/chat-session.md: a real capture of `edge-spec chat` driven by scripted input
# (two turns, /stats, /reset, /quit). Rerun it whenever the demo weights change.
#
#   docs/record_chat.sh            # the demo pair (exported into ~/.cache/edge-spec on first run)
#   docs/record_chat.sh BUNDLE     # any bundle with a chat format
#
# Environment: EDGE_SPEC (the command, default: edge-spec), CHAT_ARGS (extra options,
# default: --max-new-tokens 48 --seed 0).
set -euo pipefail
cd "$(dirname "$0")/.."

edge_spec=${EDGE_SPEC:-edge-spec}
chat_args=${CHAT_ARGS:---max-new-tokens 48 --seed 0}
bundle=("$@")
lines=("Write a Python function that adds two numbers." "Now make it subtract them instead." /stats /reset /quit)
script=$(printf '%s\n' "${lines[@]}")$'\n'
shown=$(printf '%s\\n' "${lines[@]}")

# stdout is a pipe, so the capture has no control codes; progress (first-run export) goes to the terminal.
# shellcheck disable=SC2086
capture=$(printf '%s' "$script" | $edge_spec chat "${bundle[@]}" $chat_args)

{
  echo "# A recorded \`edge-spec chat\` session"
  echo
  echo "Captured $(date -u +%Y-%m-%d) with edge-spec $($edge_spec --version | cut -d' ' -f2) on $(uname -sm) by"
  echo "\`docs/record_chat.sh\`: the input below was piped in, so the transcript shows it after each \`you>\`"
  echo "prompt (a terminal shows what you type instead, and prints the stats lines dimmed)."
  echo
  echo "The demo pair is tiny and may be replaced by better-trained weights; the replies show what the"
  echo "current weights produce, and the numbers depend on the machine. Rerun \`docs/record_chat.sh\` after"
  echo "the weights change to refresh this page."
  echo
  echo '```console'
  echo "\$ printf '$shown' | edge-spec chat ${bundle[*]:+${bundle[*]} }$chat_args"
  printf '%s\n' "$capture"
  echo '```'
  echo
  echo "What to look for:"
  echo
  echo "- each reply streams, then one line: tokens, tokens/s, draft acceptance (or why there was none),"
  echo "  how many prompt tokens reused the KV cache of the previous turn, and the process's RSS;"
  echo "- the second turn reuses the first turn's KV cache (\`KV reused N/M\`, N > 0): only the new"
  echo "  message is prefilled;"
  echo "- \`/stats\` sums the session (draft-length histogram, context in use, the memory plan, RSS now and"
  echo "  at peak); \`/reset\` rewinds the KV caches without reloading anything."
} > docs/chat-session.md
echo "Wrote docs/chat-session.md" >&2
