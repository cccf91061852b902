#!/bin/sh
# Remove what install.sh put in place, and the start-at-login entry the app writes when that
# setting is on (only if it starts this install). Your models, settings, cache and logs stay
# (~/.local/share/Hearth, ~/.config/Hearth, ~/.cache/Hearth, ~/.local/state/Hearth, or
# HEARTH_HOME); delete those folders yourself to remove them too.
set -eu

DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
BIN="${HEARTH_BIN_DIR:-$HOME/.local/bin}"
CONFIG="${XDG_CONFIG_HOME:-$HOME/.config}"
STATE="${XDG_STATE_HOME:-$HOME/.local/state}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}"
DEST="$DATA/hearth"
AUTOSTART="$CONFIG/autostart/hearth.desktop"

# the link only if it is ours
if [ -L "$BIN/hearth" ] && [ "$(readlink "$BIN/hearth")" = "$DEST/hearth" ]; then
    rm -f "$BIN/hearth"
fi
# start at login: the app writes Exec=<this install's hearth> --background; an entry that starts
# another copy (a dev checkout, the .deb's /opt/hearth) is left alone
if [ -f "$AUTOSTART" ] && grep -qF "$DEST/hearth" "$AUTOSTART"; then
    rm -f "$AUTOSTART"
fi
rm -f "$DATA/applications/hearth.desktop" "$DATA/icons/hicolor/256x256/apps/hearth.png"
rm -rf "$DEST" "$DEST.new" "$DEST.old"
command -v update-desktop-database >/dev/null 2>&1 \
    && update-desktop-database -q "$DATA/applications" || true
echo "Hearth removed from $DEST."
if [ -n "${HEARTH_HOME:-}" ]; then
    echo "Your models, settings, cache and logs are kept in $HEARTH_HOME."
else
    echo "Your models, settings, cache and logs are kept; delete these folders to remove them too:"
    echo "  models:   $DATA/Hearth"
    echo "  settings: $CONFIG/Hearth"
    echo "  cache:    $CACHE/Hearth"
    echo "  logs:     $STATE/Hearth"
fi
