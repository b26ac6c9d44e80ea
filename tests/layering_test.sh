#!/usr/bin/env bash
# The layers speak only their own words: the core (src/, include/remat/) names no model of ours —
# no GPT, attention or MLP halves, no GPT stage options ("selective" is the GPT's Megatron option; selective
# checkpointing per operator is the core's own) — and no message thrown below tools/
# (src/, include/, models/, train/) names a command-line flag: the CLI maps fields to flags.
set -u
root=${1:?usage: layering_test.sh SOURCE_DIR}
status=0
model_words=$(grep -rniE 'gpt|attn|ffn|\bmlp\b|"selective"|matmul-inputs|"half"' "$root/src" "$root/include/remat")
if [ -n "$model_words" ]; then
  echo "GPT vocabulary in the core:"; echo "$model_words"; status=1
fi
flag_words=$(grep -rnE '"[^"]*--[a-z]' "$root/src" "$root/include" "$root/models" "$root/train")
if [ -n "$flag_words" ]; then
  echo "command-line flags in library strings:"; echo "$flag_words"; status=1
fi
[ $status -eq 0 ] && echo "layering ok"
exit $status
