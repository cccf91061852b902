#!/bin/sh
# Install Hearth for this user (no root): run from the unpacked hearth-VERSION-linux-x86_64/.
#   the app folder   -> ${XDG_DATA_HOME:-~/.local/share}/hearth/
#   the command      -> ~/.local/bin/hearth (a link; HEARTH_BIN_DIR overrides the folder)
#   menu entry, icon -> $XDG_DATA_HOME/applications/hearth.desktop,
#                       $XDG_DATA_HOME/icons/hicolor/256x256/apps/hearth.png
# Installing again replaces the app and keeps your models and settings. Remove with
# ~/.local/share/hearth/uninstall.sh.
set -eu

SRC="$(cd "$(dirname "$0")" && pwd)"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
BIN="${HEARTH_BIN_DIR:-$HOME/.local/bin}"
DEST="$DATA/hearth"
APPS="$DATA/applications"
ICONS="$DATA/icons/hicolor/256x256/apps"

[ -x "$SRC/hearth/hearth" ] || { echo "install.sh: no hearth/hearth next to this script" >&2; exit 1; }
mkdir -p "$DATA" "$BIN" "$APPS" "$ICONS"

# copy beside the old install, then swap, so a failed copy leaves the old one working
rm -rf "$DEST.new" "$DEST.old"
cp -a "$SRC/hearth" "$DEST.new"
cp "$SRC/uninstall.sh" "$DEST.new/uninstall.sh"
chmod 755 "$DEST.new/uninstall.sh"
if [ -e "$DEST" ]; then mv "$DEST" "$DEST.old"; fi
mv "$DEST.new" "$DEST"
rm -rf "$DEST.old"

ln -sfn "$DEST/hearth" "$BIN/hearth"
cp "$SRC/hearth.png" "$ICONS/hearth.png"
# Exec is quoted as the desktop-entry spec asks (a path with spaces): inside the quotes \ " ` $
# take a backslash, itself written doubled in the file
exec_path=$(printf '%s' "$DEST/hearth" | sed -e 's/[\\"`$]/\\\\&/g')
sed -e '/^Exec=/d' -e 's|@ICON@|hearth|' "$SRC/hearth.desktop.in" > "$APPS/hearth.desktop"
printf 'Exec="%s"\n' "$exec_path" >> "$APPS/hearth.desktop"
chmod 644 "$APPS/hearth.desktop"

# refresh the menu's cache where the desktop keeps one (harmless when absent); no icon cache is
# written: a per-user hicolor folder has none, and one made here would go stale
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$APPS" || true

echo "Hearth installed in $DEST"
echo "  command: $BIN/hearth    menu: Hearth ($APPS/hearth.desktop)"
case ":$PATH:" in
    *":$BIN:"*) ;;
    *) echo "  note: $BIN is not on your PATH; add it, or run $BIN/hearth" ;;
esac
