# sinfo.

#% sinfo-default
run sinfo

#% sinfo-nodes
run sinfo -N

#% sinfo-format
run sinfo -h -o '%P %a %l %D %t %N %G'

#% sinfo-summarize
run sinfo -s

#% sinfo-partition-filter
run sinfo -p debug -h -o '%P %l'

#% sinfo-Format
run sinfo -h -O 'Partition,Available,Time,Nodes,StateCompact'

#% sinfo-reasons-empty
run sinfo -R

#% sinfo-bad-option
run sinfo --no-such-option

#% sinfo-unknown-partition
run sinfo -p nosuch
