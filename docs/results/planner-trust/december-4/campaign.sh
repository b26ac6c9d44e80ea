#!/bin/bash
# Issue 31's campaign of December 4: three runs of each example, one after another, nothing else running.
cd /work/main
log=/tmp/camp/campaign-log.txt
: > $log
for r in 1 2 3; do
  for m in mixer convnet transformer; do
    steps=21; [ $m = mixer ] && steps=41
    s=$(date +%s)
    echo "run $r $m start $(date -u +%H:%M:%S)" >> $log
    build/examples/remat_plan_$m --steps $steps > /tmp/camp/run$r-$m.txt 2>&1
    rc=$?
    echo "run $r $m steps=$steps rc=$rc $(( $(date +%s) - s )) s" >> $log
  done
done
echo finished >> $log
