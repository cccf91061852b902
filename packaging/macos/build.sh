#!/usr/bin/env bash
# UNVERIFIED: written on Linux, never run on a Mac. Build Hearth for macOS arm64:
#
#   packaging/macos/build.sh
#
# Makes dist/Hearth.app (PyInstaller BUNDLE, icon and Info.plist version from pyproject.toml)
# and dist/Hearth-VERSION-macos-arm64.dmg, with llama.cpp's Metal backend (packaging/gpu.sh:
# Metal on Apple silicon; HEARTH_GPU=cpu overrides) and MLX. Signing and notarization run
# when their variables are set (Apple credentials, needed at release time only):
#   APPLE_SIGN_IDENTITY   "Developer ID Application: NAME (TEAM_ID)" in the login keychain
#   APPLE_TEAM_ID         the team id (10 characters)
#   APPLE_ID, APPLE_APP_PASSWORD   an Apple ID and an app-specific password for notarytool,
#   or APPLE_NOTARY_PROFILE        a profile saved with `xcrun notarytool store-credentials`
# Without APPLE_SIGN_IDENTITY the app is ad-hoc signed (runs here; Gatekeeper warns elsewhere).
# PYTHON: an interpreter with Hearth (pip install ".[mlx,speech]"), pyinstaller, and a Metal build of
# llama-cpp-python; without it the script makes build/venv-metal with CMAKE_ARGS=-DGGML_METAL=on.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/packaging/macos"
# shellcheck source=../gpu.sh
. "$ROOT/packaging/gpu.sh"
[ "$(uname -s)" = Darwin ] || { echo "packaging/macos/build.sh runs on macOS" >&2; exit 1; }
[ "$(uname -m)" = arm64 ] || echo "warning: not Apple silicon; the build is $(uname -m), without Metal" >&2
hearth_build_setup "$ROOT"  # LLAMA_VERSION, BACKEND, PY, VERSION
DIST="$ROOT/dist"
WORK="$ROOT/build/macos"
DMG="$DIST/Hearth-$VERSION-macos-arm64.dmg"
rm -rf "$WORK" "$DIST/Hearth.app" "$DMG"
mkdir -p "$WORK" "$DIST"
echo "== Hearth $VERSION, llama.cpp backend: $BACKEND, python: $PY"

echo "== icon: Hearth.icns from assets/hearth.png"
ICONSET="$WORK/Hearth.iconset"
mkdir -p "$ICONSET"
for size in 16 32 128 256 512; do
    sips -z "$size" "$size" "$ROOT/assets/hearth.png" --out "$ICONSET/icon_${size}x${size}.png" >/dev/null
    double=$((size * 2))
    sips -z "$double" "$double" "$ROOT/assets/hearth.png" --out "$ICONSET/icon_${size}x${size}@2x.png" >/dev/null
done
iconutil -c icns "$ICONSET" -o "$WORK/Hearth.icns"

echo "== PyInstaller"
PYTHONPATH="$ROOT" HEARTH_VERSION="$VERSION" HEARTH_ICON="$WORK/Hearth.icns" HEARTH_MLX=1 \
    "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$WORK/dist" --workpath "$WORK/pyinstaller" "$ROOT/packaging/hearth.spec"
APP="$WORK/dist/Hearth.app"
/usr/libexec/PlistBuddy -c "Print :CFBundleShortVersionString" "$APP/Contents/Info.plist"
"$APP/Contents/MacOS/hearth" --version

echo "== codesign"
IDENTITY="${APPLE_SIGN_IDENTITY:--}"  # "-" is an ad-hoc signature
sign() {
    local opts=(--force --sign "$IDENTITY")
    [ "$IDENTITY" = - ] || opts+=(--options runtime --timestamp --entitlements "$HERE/entitlements.plist")
    codesign "${opts[@]}" "$@"
}
# inside out: every library and executable first, then the bundle itself (no --deep)
find "$APP/Contents" -type f \( -name "*.dylib" -o -name "*.so" -o -perm -u+x \) -print0 \
    | while IFS= read -r -d '' f; do
        if file "$f" | grep -q "Mach-O"; then sign "$f"; fi
    done
sign "$APP"
codesign --verify --deep --strict --verbose=2 "$APP"

echo "== $(basename "$DMG")"
STAGE="$WORK/dmg"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/Hearth.app"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "Hearth $VERSION" -srcfolder "$STAGE" -ov -format UDZO "$DMG"
[ "$IDENTITY" = - ] || codesign --force --timestamp --sign "$IDENTITY" "$DMG"
cp -R "$APP" "$DIST/Hearth.app"

if [ "$IDENTITY" != - ] && { [ -n "${APPLE_NOTARY_PROFILE:-}" ] || [ -n "${APPLE_ID:-}" ]; }; then
    echo "== notarize (xcrun notarytool, waits for Apple's verdict)"
    if [ -n "${APPLE_NOTARY_PROFILE:-}" ]; then
        auth=(--keychain-profile "$APPLE_NOTARY_PROFILE")
    else
        : "${APPLE_TEAM_ID:?set APPLE_TEAM_ID}" "${APPLE_APP_PASSWORD:?set APPLE_APP_PASSWORD}"
        auth=(--apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" --password "$APPLE_APP_PASSWORD")
    fi
    xcrun notarytool submit "$DMG" "${auth[@]}" --wait
    xcrun stapler staple "$DMG"
    xcrun stapler validate "$DMG"
    spctl --assess --type open --context context:primary-signature --verbose "$DMG"
else
    echo "== not notarized (set APPLE_SIGN_IDENTITY and APPLE_ID/APPLE_TEAM_ID/APPLE_APP_PASSWORD or APPLE_NOTARY_PROFILE)"
fi
du -sh "$DIST/Hearth.app" "$DMG"
