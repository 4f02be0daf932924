#!/usr/bin/env bash
# Install what llmgym.sandbox needs to run untrusted code isolated (Debian/Ubuntu, as root).
#
#   bubblewrap       -> bwrap: namespaces (net, pid, ipc, uts, mount), read-only system view, tmpfs
#   python3-seccomp  -> libseccomp bindings for the *system* python3 that runs the sandboxed code
#   util-linux       -> setpriv (real uid/gid drop so RLIMIT_NPROC is enforced), prlimit
#   python3          -> /usr/bin/python3, an interpreter the unprivileged sandbox uid can read
#
# Idempotent: installs only what is missing; `apt-get update` runs only when something is.
# Safe to call from CI on every run.  Prints `llmgym sandbox: ok` (and a check) at the end.
set -euo pipefail

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
[ -x /usr/bin/python3 ] || need+=(python3)
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1; then
    need+=(python3-seccomp)
fi

if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "install-sandbox: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-sandbox: no apt-get; install by hand: ${need[*]}" >&2
        exit 1
    fi
    echo "install-sandbox: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

bwrap --version
/usr/bin/python3 -c 'import seccomp, sys; print("python3-seccomp ok for", sys.version.split()[0])'
setpriv --version
echo "llmgym sandbox: ok"
