#!/bin/sh
# Remove what install.sh put in place. Your models, settings and logs stay (`hearth` keeps them
# in ~/.local/share/Hearth, ~/.config/Hearth, ~/.cache/Hearth, or HEARTH_HOME); delete those
# folders yourself to remove them too.
set -eu

DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
BIN="${HEARTH_BIN_DIR:-$HOME/.local/bin}"
DEST="$DATA/hearth"

# the link only if it is ours
if [ -L "$BIN/hearth" ] && [ "$(readlink "$BIN/hearth")" = "$DEST/hearth" ]; then
    rm -f "$BIN/hearth"
fi
rm -f "$DATA/applications/hearth.desktop" "$DATA/icons/hicolor/256x256/apps/hearth.png"
rm -rf "$DEST" "$DEST.new" "$DEST.old"
command -v update-desktop-database >/dev/null 2>&1 \
    && update-desktop-database -q "$DATA/applications" || true
echo "Hearth removed from $DEST (models and settings kept)"
