#!/bin/bash
# Byte comparison of every output file of `python -m oasis_sim run` between two checkouts: the bundled demo (its
# defaults; its stdout without the wall-time line) and each TRACE.json in lookahead and dense (--quiet).
#   bash experiments/simulator_speed/compare_outputs.sh BEFORE_SRC AFTER_SRC OUT_DIR TRACE.json...
# BEFORE_SRC / AFTER_SRC: checkouts (e.g. `git archive COMMIT | tar -x -C DIR`); prints "same" or "DIFF" per file.
set -u
before=$(realpath "$1") after=$(realpath "$2") out=$(realpath -m "$3")
shift 3
traces=()
for t in "$@"; do traces+=("$(realpath "$t")"); done
for side in before after; do
  src=${!side}
  mkdir -p "$out/$side"
  # (run from the checkout: `python -m` imports the current directory's package first)
  (cd "$src" && PYTHONPATH=$src python -m oasis_sim run --out "$out/$side/demo") 2>&1 | grep -v "simulated / wall" |
    sed "s#$out/$side#OUT#" >"$out/$side/demo.stdout"
  for t in "${traces[@]}"; do
    name=$(basename "$t" .json)
    for m in lookahead dense; do
      (cd "$src" && PYTHONPATH=$src python -m oasis_sim run "$t" --mode "$m" --quiet --out "$out/$side/$name-$m") 2>/dev/null
    done
  done
done
cmp -s "$out/before/demo.stdout" "$out/after/demo.stdout" && echo "same demo stdout" || echo "DIFF demo stdout"
for d in "$out"/before/*/; do
  d=$(basename "$d")
  for f in "$out/before/$d"/*; do
    f=$(basename "$f")
    [ "$f" = timing.json ] && continue  # (wall time)
    # (the demo's summary names its trace by the checkout's path)
    cmp -s <(sed "s#$before#SRC#" "$out/before/$d/$f") <(sed "s#$after#SRC#" "$out/after/$d/$f") &&
      echo "same $d/$f" || echo "DIFF $d/$f"
  done
done
