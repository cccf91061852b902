#!/usr/bin/env bash
# Build Hearth's Linux x86-64 packages: one command, from the repository root or anywhere.
#
#   PYTHON=.venv/bin/python packaging/linux/build.sh
#
# Makes (in dist/, git-ignored):
#   dist/hearth-VERSION-linux-x86_64.tar.gz   the PyInstaller one-folder bundle + install.sh
#   dist/hearth_VERSION_amd64.deb             the same bundle in /opt/hearth (dpkg-deb)
# The llama.cpp backend is chosen by packaging/gpu.sh: CUDA when nvcc or nvidia-smi is there,
# Vulkan when the Vulkan SDK is, else CPU; HEARTH_GPU=cuda|vulkan|cpu overrides.
# PYTHON: an interpreter with Hearth, its dependencies and pyinstaller installed, whose
# llama-cpp-python has that backend (it is checked, never rebuilt unless HEARTH_LLAMA_REBUILD=1).
# Without PYTHON the script makes build/venv-BACKEND (pip install ".[speech]" with that backend's
# CMAKE_ARGS; 20-40 minutes the first time on 2 cores: llama.cpp's CPU backend is compiled once
# per x86-64 CPU level) and builds from it (HEARTH_BUILD_VENV: another folder for it).
# The build refuses a llama.cpp built for one CPU (a dev venv's -march=native build) and prints
# the command that rebuilds it. The bundle runs on the glibc of the build machine or newer:
# build-in-chroot.sh builds inside an Ubuntu 22.04 root (glibc 2.35); BUILD-INFO and the .deb's
# Depends record the floor measured on the bundle's ELF files.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/packaging/linux"
# shellcheck source=../gpu.sh
. "$ROOT/packaging/gpu.sh"
hearth_build_setup "$ROOT"  # LLAMA_VERSION, BACKEND, PY, VERSION
NAME="hearth-$VERSION-linux-x86_64"
DIST="$ROOT/dist"
WORK="$ROOT/build/linux"
t0=$(date +%s)

echo "== Hearth $VERSION, llama.cpp backend: $BACKEND, python: $PY"
LLAMA_LIB="$(hearth_llama_lib "$PY")"
if [ "$(uname -m)" = x86_64 ] && ! hearth_llama_portable "$LLAMA_LIB"; then
    echo "refusing to bundle a llama.cpp built for one CPU. Rebuild it for every CPU level:" >&2
    echo "  CMAKE_ARGS=\"$(hearth_cmake_args "$BACKEND")\" $PY -m pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==$LLAMA_VERSION" >&2
    echo "or unset PYTHON (the script builds build/venv-$BACKEND so)" >&2
    exit 1
fi
CPU_LEVELS="$(cd "$LLAMA_LIB" && ls libggml-cpu-*.so 2>/dev/null | sed 's/^libggml-cpu-//; s/\.so$//' | tr '\n' ' ')"

echo "== PyInstaller"
rm -rf "$WORK" "$DIST/$NAME" "$DIST/pyinstaller"
mkdir -p "$WORK" "$DIST"
# PYTHONPATH puts this checkout's app/ ahead of any editable install the venv has
PYTHONPATH="$ROOT" HEARTH_VERSION="$VERSION" "$PY" -m PyInstaller --noconfirm --clean \
    --log-level WARN --distpath "$DIST/pyinstaller" --workpath "$WORK/pyinstaller" \
    "$ROOT/packaging/hearth.spec"
BUNDLE="$DIST/pyinstaller/hearth"
echo "== PyInstaller took $(($(date +%s) - t0)) s"

# the bundle must hold this checkout's app package, not another copy the interpreter can see
toc="$WORK/pyinstaller/hearth/Analysis-00.toc"
if ! grep -q "'$ROOT/app/cli/__init__.py'" "$toc"; then
    echo "the bundle's app/ does not come from $ROOT (see $toc)" >&2
    exit 1
fi
# one real file per library: a wheel stores libllama.so, .so.0 and .so.0.5.0 as three copies
# (and PyInstaller may add a fourth); the others become links to the name the loader asks for
"$PY" "$HERE/tidy_bundle.py" "$BUNDLE"
got="$("$BUNDLE/hearth" --version)"
[ "$got" = "hearth $VERSION" ] || { echo "bundle says '$got', expected 'hearth $VERSION'" >&2; exit 1; }

echo "== $NAME.tar.gz"
STAGE="$DIST/$NAME"
mkdir -p "$STAGE"
cp -a "$BUNDLE" "$STAGE/hearth"
cp "$ROOT/assets/hearth.png" "$STAGE/hearth.png"
cp "$HERE/install.sh" "$HERE/uninstall.sh" "$STAGE/"
sed "s/@VERSION@/$VERSION/" "$HERE/hearth.desktop.in" > "$STAGE/hearth.desktop.in"
# the newest glibc symbol version any ELF file in the bundle asks for: the oldest glibc it runs on
GLIBC_FLOOR="$("$PY" "$HERE/tidy_bundle.py" --glibc-floor "$STAGE/hearth")"
{
    echo "$VERSION $BACKEND"
    echo "glibc: $GLIBC_FLOOR"
    echo "built-on: $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
    echo "llama-cpu-levels: ${CPU_LEVELS:-built in}"
} > "$STAGE/hearth/BUILD-INFO"
echo "== needs glibc >= $GLIBC_FLOOR; llama.cpp CPU levels: ${CPU_LEVELS:-built in}"
chmod 755 "$STAGE/install.sh" "$STAGE/uninstall.sh"
tar -C "$DIST" -czf "$DIST/$NAME.tar.gz" "$NAME"

echo "== hearth_${VERSION}_amd64.deb"
DEB="$WORK/deb"
rm -rf "$DEB"
mkdir -p "$DEB/DEBIAN" "$DEB/opt" "$DEB/usr/bin" "$DEB/usr/share/applications" \
    "$DEB/usr/share/icons/hicolor/256x256/apps" "$DEB/usr/share/doc/hearth"
cp -a "$STAGE/hearth" "$DEB/opt/hearth"
ln -s /opt/hearth/hearth "$DEB/usr/bin/hearth"
sed -e "s|@EXEC@|/opt/hearth/hearth|" -e "s|@ICON@|hearth|" "$STAGE/hearth.desktop.in" \
    > "$DEB/usr/share/applications/hearth.desktop"
cp "$ROOT/assets/hearth.png" "$DEB/usr/share/icons/hicolor/256x256/apps/hearth.png"
cp "$HERE/copyright" "$DEB/usr/share/doc/hearth/copyright"
size_kb="$(du -sk "$DEB/opt" "$DEB/usr" | awk '{s += $1} END {print s}')"
# the bundle needs the glibc its ELF files ask for, or newer (PyInstaller does not bundle libc)
glibc="$GLIBC_FLOOR"
cat > "$DEB/DEBIAN/control" <<CONTROL
Package: hearth
Version: $VERSION
Architecture: amd64
Maintainer: Hearth developers <hearth@localhost>
Installed-Size: $size_kb
Depends: libc6 (>= $glibc), libegl1, libgl1, libxcb1
Recommends: libwayland-client0, libwayland-cursor0, libwayland-egl1
Section: utils
Priority: optional
Description: Run open LLMs locally and serve them over OpenAI-compatible APIs
 A desktop app and a headless server (hearth serve) that run GGUF models in process with
 llama.cpp ($BACKEND build) and serve them on localhost through OpenAI, Anthropic and
 Ollama wire APIs.
CONTROL
# dpkg -V checks installed files against these
(cd "$DEB" && find opt usr -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum) > "$DEB/DEBIAN/md5sums"
# xz makes the smallest package (76 MB against the tarball's 105) but takes minutes on 2 cores;
# HEARTH_DEB_COMPRESS=gzip for quick local builds
dpkg-deb --root-owner-group "-Z${HEARTH_DEB_COMPRESS:-xz}" --build "$DEB" "$DIST/hearth_${VERSION}_amd64.deb" >/dev/null

t1=$(date +%s)
echo "== built in $((t1 - t0)) s"
du -sh "$STAGE/hearth" "$DIST/$NAME.tar.gz" "$DIST/hearth_${VERSION}_amd64.deb"
du -sb "$STAGE/hearth" "$DIST/$NAME.tar.gz" "$DIST/hearth_${VERSION}_amd64.deb" \
    | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}' 
echo "bundle: $STAGE/hearth   (smoke test: packaging/linux/smoke.sh)"
echo "AppImage: not built (appimagetool is in no package registry this build can use)"
