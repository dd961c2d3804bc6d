#!/usr/bin/env bash
# podman with the settings that machines without a full container setup need;
# every podman command of deploy/image/ goes through here, so they live in one
# place:
#   --runtime runc --cgroup-manager cgroupfs  crun refuses a hybrid cgroup
#                                             hierarchy; runc with cgroupfs works
#   --ulimit nofile=N:N --ulimit nproc=M:M    podman's defaults (1048576) exceed
#                                             the hard limits of such machines,
#                                             and runc may not raise them; the
#                                             host's own hard limits instead
# (on `build`, `run` and `create`). Set TOOLGATE_PODMAN_FLAGS= (empty) to run
# plain podman, e.g. on a workstation where it works as it is.
#
#   deploy/image/podman.sh build --network host -f deploy/Dockerfile -t toolgate .
set -euo pipefail

if [[ -z ${TOOLGATE_PODMAN_FLAGS+set} ]]; then
  global=(--runtime runc --cgroup-manager cgroupfs)
  # nproc: conmon and runc run under at most pid_max processes, whatever the
  # shell's limit says.
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max)
  [[ $nofile == unlimited ]] && nofile=1048576
  if [[ $nproc == unlimited ]] || ((nproc > pid_max)); then nproc=$pid_max; fi
  limits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
else
  read -r -a global <<<"$TOOLGATE_PODMAN_FLAGS"
  limits=()
fi

case ${1:-} in
  build | run | create)
    sub=$1
    shift
    exec podman "${global[@]}" "$sub" "${limits[@]}" "$@"
    ;;
  *) exec podman "${global[@]}" "$@" ;;
esac
