#!/usr/bin/env bash
# Build the Linux packages inside an Ubuntu 22.04 (jammy) root, so that the bundle runs on
# glibc 2.35 and newer (Ubuntu 22.04+, Debian 12+, Fedora 36+, ...) instead of the build
# machine's glibc. jammy is the oldest base the Ubuntu archive serves with a Python new enough
# for Hearth's code (3.11: datetime.UTC and more; jammy-updates has python3.11, 3.11.0rc1);
# PySide6's wheels need glibc 2.28 (manylinux_2_28), so it is not Qt that sets the floor. Needs root (debootstrap, chroot, bind mounts) and the network
# (archive.ubuntu.com, PyPI). Everything else is build.sh, run inside the root:
#
#   sudo packaging/linux/build-in-chroot.sh
#
# HEARTH_BUILD_ROOT  the root folder (default build/jammy-root): made once with debootstrap
#                    (a root from `debootstrap --foreign` is finished with its second stage),
#                    then reused
# HEARTH_CHROOT_MIRROR  the Ubuntu archive (default http://archive.ubuntu.com/ubuntu)
# HEARTH_CHROOT_FIND_LINKS  a folder of wheels pip takes first, as the root sees it (e.g.
#                    /src/build/wheels: a llama-cpp-python wheel built in the root before)
# The checkout is bound at /src inside, so dist/ gets the packages as with build.sh; the build
# venv is build/venv-cpu-jammy. HEARTH_GPU is cpu (a GPU toolkit is not in the root).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
R="${HEARTH_BUILD_ROOT:-$ROOT/build/jammy-root}"
MIRROR="${HEARTH_CHROOT_MIRROR:-http://archive.ubuntu.com/ubuntu}"
# the compiler for llama.cpp, Python with venv and headers, binutils (objdump, readelf), and the
# system libraries PyInstaller copies into the bundle for Qt's xcb and wayland plugins
PACKAGES="python3,python3-venv,python3-dev,python3-pip,build-essential,binutils,ca-certificates,\
libgl1,libegl1,libxkbcommon0,libxkbcommon-x11-0,libxcb-cursor0,libxcb-icccm4,libxcb-keysyms1,\
libxcb-image0,libxcb-render-util0,libxcb-randr0,libxcb-shape0,libxcb-xinerama0,libxcb-xkb1,\
libxcb-shm0,libxcb-sync1,libxcb-xfixes0,libxcb-util1,libfontconfig1,libfreetype6,libdbus-1-3,\
libwayland-client0,libwayland-cursor0,libwayland-egl1,libx11-xcb1,libglib2.0-0"

[ "$(id -u)" = 0 ] || { echo "build-in-chroot.sh needs root (debootstrap, chroot, mount)" >&2; exit 1; }
# a private mount namespace: the bind mounts go away with this script, however it ends
if [ -z "${HEARTH_CHROOT_NS:-}" ]; then
    exec unshare --mount --propagation private env HEARTH_CHROOT_NS=1 "$0" "$@"
fi

t0=$(date +%s)
if [ ! -f "$R/.hearth-root-ready" ]; then
    if [ -x "$R/debootstrap/debootstrap" ]; then
        echo "== finishing the jammy root in $R (debootstrap second stage)"
        chroot "$R" /debootstrap/debootstrap --second-stage
    else
        command -v debootstrap >/dev/null || { echo "apt install debootstrap" >&2; exit 1; }
        echo "== making a jammy root in $R (debootstrap)"
        debootstrap --arch=amd64 --variant=minbase --components=main,universe \
            --include="$PACKAGES" jammy "$R" "$MIRROR"
    fi
    # Python 3.11 is in jammy-updates (jammy's own python3 is 3.10, too old for Hearth)
    echo "deb $MIRROR jammy-updates main universe" > "$R/etc/apt/sources.list.d/updates.list"
    cp /etc/resolv.conf "$R/etc/resolv.conf"
    chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update -qq && apt-get install -y -qq python3.11 python3.11-venv python3.11-dev'
    touch "$R/.hearth-root-ready"
    echo "== root ready in $(($(date +%s) - t0)) s"
fi

mkdir -p "$R/src" "$R/proc" "$R/dev" "$R/sys" "$R/tmp"
mount --bind "$ROOT" "$R/src"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount --rbind /sys "$R/sys"
cp /etc/resolv.conf "$R/etc/resolv.conf"
envs=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
    HEARTH_GPU=cpu HEARTH_BUILD_VENV=/src/build/venv-cpu-jammy HEARTH_BASE_PYTHON=python3.11
    "HEARTH_DEB_COMPRESS=${HEARTH_DEB_COMPRESS:-xz}" "PIP_DEFAULT_TIMEOUT=${PIP_DEFAULT_TIMEOUT:-180}")
[ -z "${HEARTH_CHROOT_FIND_LINKS:-}" ] || envs+=("PIP_FIND_LINKS=$HEARTH_CHROOT_FIND_LINKS")
# a CA bundle pip is told to trust here (a proxy's) is trusted inside too
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    cp "$PIP_CERT" "$R/etc/ssl/certs/hearth-build-ca.pem"
    envs+=(PIP_CERT=/etc/ssl/certs/hearth-build-ca.pem)
fi
echo "== build.sh inside $(. "$R/etc/os-release" && echo "$PRETTY_NAME")"
chroot "$R" /usr/bin/env -i "${envs[@]}" bash /src/packaging/linux/build.sh
echo "== build-in-chroot.sh took $(($(date +%s) - t0)) s"
