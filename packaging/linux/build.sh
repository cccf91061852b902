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
# Without PYTHON the script makes build/venv-BACKEND (pip install . with that backend's
# CMAKE_ARGS; minutes the first time) and builds from it.
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
got="$("$BUNDLE/hearth" --version)"
[ "$got" = "hearth $VERSION" ] || { echo "bundle says '$got', expected 'hearth $VERSION'" >&2; exit 1; }

echo "== $NAME.tar.gz"
STAGE="$DIST/$NAME"
mkdir -p "$STAGE"
cp -a "$BUNDLE" "$STAGE/hearth"
cp "$ROOT/assets/hearth.png" "$STAGE/hearth.png"
cp "$HERE/install.sh" "$HERE/uninstall.sh" "$STAGE/"
sed "s/@VERSION@/$VERSION/" "$HERE/hearth.desktop.in" > "$STAGE/hearth.desktop.in"
echo "$VERSION $BACKEND" > "$STAGE/hearth/BUILD-INFO"
chmod 755 "$STAGE/install.sh" "$STAGE/uninstall.sh"
tar -C "$DIST" -czf "$DIST/$NAME.tar.gz" "$NAME"

echo "== hearth_${VERSION}_amd64.deb"
DEB="$WORK/deb"
rm -rf "$DEB"
mkdir -p "$DEB/DEBIAN" "$DEB/opt" "$DEB/usr/bin" "$DEB/usr/share/applications" \
    "$DEB/usr/share/icons/hicolor/256x256/apps"
cp -a "$STAGE/hearth" "$DEB/opt/hearth"
ln -s /opt/hearth/hearth "$DEB/usr/bin/hearth"
sed -e "s|@EXEC@|/opt/hearth/hearth|" -e "s|@ICON@|hearth|" "$STAGE/hearth.desktop.in" \
    > "$DEB/usr/share/applications/hearth.desktop"
cp "$ROOT/assets/hearth.png" "$DEB/usr/share/icons/hicolor/256x256/apps/hearth.png"
size_kb="$(du -sk "$DEB/opt" | cut -f1)"
# the bundle needs the glibc it was built against, or newer (PyInstaller does not bundle libc)
glibc="$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
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
# xz makes the smallest package (76 MB against the tarball's 105) but takes minutes on 2 cores;
# HEARTH_DEB_COMPRESS=gzip for quick local builds
dpkg-deb --root-owner-group "-Z${HEARTH_DEB_COMPRESS:-xz}" --build "$DEB" "$DIST/hearth_${VERSION}_amd64.deb" >/dev/null

t1=$(date +%s)
echo "== built in $((t1 - t0)) s"
du -sh "$BUNDLE" "$DIST/$NAME.tar.gz" "$DIST/hearth_${VERSION}_amd64.deb"
echo "bundle: $STAGE/hearth   (smoke test: packaging/linux/smoke.sh)"
echo "AppImage: not built (appimagetool is in no package registry this build can use)"
