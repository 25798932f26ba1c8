#!/usr/bin/env bash
# Build "DFlash Chat.app" and a DMG on a Mac (Apple Silicon, macOS 13.5+), optionally signed
# with a Developer ID, notarized and stapled. One command, run from anywhere:
#
#   packaging/build_macos.sh                       # unsigned app + DMG (says so at the end)
#   DEVELOPER_ID="Developer ID Application: Jane Doe (TEAMID1234)" \
#   NOTARY_PROFILE=dflash-notary packaging/build_macos.sh   # signed, notarized, stapled
#
# Environment:
#   DEVELOPER_ID        codesign identity (a "Developer ID Application" certificate in the
#                       keychain). Unset: no signing beyond PyInstaller's ad-hoc signature.
#   NOTARY_PROFILE      a notarytool keychain profile (xcrun notarytool store-credentials NAME)
#   APPLE_ID, APPLE_TEAM_ID, APPLE_APP_PASSWORD
#                       or these three instead of NOTARY_PROFILE (app-specific password)
#   PYTHON              interpreter for the build venv when .venv is missing (default python3)
#   SKIP_SMOKE_TEST=1   do not run the built app (--version, compare on the demo pair)
#
# Output: dist/DFlash Chat.app and dist/DFlash-Chat-<version>.dmg
# Steps: venv + pinned deps -> icon -> PyInstaller (packaging/dflash_chat.spec) -> smoke test
# -> sign inside-out with hardened runtime -> notarize + staple the app -> DMG -> sign,
# notarize and staple the DMG.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

APP_NAME="DFlash Chat"
DIST="$ROOT/dist"
BUILD="$ROOT/build"
APP="$DIST/$APP_NAME.app"
ENTITLEMENTS="$ROOT/packaging/entitlements.plist"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

[[ "$(uname -s)" == "Darwin" ]] || die "this script builds the macOS app; run it on a Mac (on Linux use 'make app')"
if [[ "$(uname -m)" != "arm64" ]]; then
    printf 'warning: building on %s; MLX runs on Apple Silicon (arm64) only\n' "$(uname -m)" >&2
fi
for tool in codesign hdiutil ditto xcrun; do
    command -v "$tool" >/dev/null || die "'$tool' not found (install the Xcode command line tools: xcode-select --install)"
done

# --- 1. Python environment with the pinned dependencies -----------------------------------
if [[ ! -x "$PY" ]]; then
    log "creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
log "installing the app and PyInstaller into $VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -e ".[app]"
VERSION="$("$PY" -c 'import app; print(app.__version__)')"
DMG="$DIST/DFlash-Chat-$VERSION.dmg"

# --- 2. Build ---------------------------------------------------------------------------
log "building $APP_NAME $VERSION with PyInstaller"
rm -rf "${APP:?}" "${DIST:?}/${APP_NAME:?}" "${DMG:?}"
"$PY" -m PyInstaller --noconfirm --clean --distpath "$DIST" --workpath "$BUILD" \
    packaging/dflash_chat.spec
[[ -d "$APP" ]] || die "PyInstaller did not produce $APP"
# The one-folder build is also left in dist/DFlash Chat/; only the .app ships.

EXE="$APP/Contents/MacOS/dflash-chat"
# MLX loads mlx.metallib from the folder of the library that holds its code (dladdr on
# libmlx.dylib), so the metallib must be reachable there (a file or PyInstaller's symlink
# into Contents/Resources).
LIBMLX="$(find "$APP/Contents" -name 'libmlx*.dylib' -print -quit)"
[[ -n "$LIBMLX" ]] || die "libmlx.dylib is missing from the app bundle"
[[ -e "$(dirname "$LIBMLX")/mlx.metallib" ]] || die "mlx.metallib is not beside ${LIBMLX#"$APP/"}"
log "libmlx and mlx.metallib: $(dirname "${LIBMLX#"$APP/"}")/"

# --- 3. Smoke test: the frozen app runs MLX (Metal) on the bundled pair --------------------
smoke_test() {
    log "smoke test: $EXE --version"
    "$EXE" --version
    if [[ -f "$ROOT/resources/models/demo-target/config.json" ]]; then
        log "smoke test: compare --json on the bundled demo pair"
        local out
        out="$("$EXE" compare --json --max-tokens 32)"
        printf '%s' "$out" | "$PY" -c 'import json, sys; r = json.load(sys.stdin); sys.exit(0 if r["identical"] else "plain and DFlash differ")'
        log "smoke test: plain and DFlash outputs are identical"
    else
        log "smoke test: no bundled demo pair in resources/models; compare skipped"
    fi
}
if [[ "${SKIP_SMOKE_TEST:-0}" != "1" ]]; then
    smoke_test
fi

# --- 4. Sign inside-out with the hardened runtime ---------------------------------------
SIGNED=0
NOTARIZED=0
sign_one() {
    # $1: path; extra arguments are passed to codesign.
    local target="$1"
    shift
    codesign --force --timestamp --options runtime --sign "$DEVELOPER_ID" "$@" "$target"
}

if [[ -n "${DEVELOPER_ID:-}" ]]; then
    log "signing with '$DEVELOPER_ID' (hardened runtime, inside-out)"
    # Every Mach-O file except the main executable (leaves: order among them does not matter).
    while IFS= read -r -d '' file; do
        [[ "$file" == "$EXE" ]] && continue
        if file -b "$file" | grep -q 'Mach-O'; then
            sign_one "$file"
        fi
    done < <(find "$APP/Contents" -type f -print0)
    # Nested bundles (Qt frameworks) after their contents, deepest first (a reverse sort puts
    # "x.framework/y.framework" before "x.framework"), then the main executable and the app.
    while IFS= read -r -d '' bundle; do
        sign_one "$bundle"
    done < <(find "$APP/Contents" -type d \( -name '*.framework' -o -name '*.app' \) -print0 | sort -z -r)
    sign_one "$EXE" --entitlements "$ENTITLEMENTS"
    sign_one "$APP" --entitlements "$ENTITLEMENTS"
    codesign --verify --deep --strict --verbose=2 "$APP"
    SIGNED=1
else
    log "DEVELOPER_ID is not set: the app is NOT signed with a Developer ID (ad-hoc only)"
fi

# --- 5. Notarize and staple ---------------------------------------------------------------
notary_args=()
if [[ -n "${NOTARY_PROFILE:-}" ]]; then
    notary_args=(--keychain-profile "$NOTARY_PROFILE")
elif [[ -n "${APPLE_ID:-}" && -n "${APPLE_TEAM_ID:-}" && -n "${APPLE_APP_PASSWORD:-}" ]]; then
    notary_args=(--apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" --password "$APPLE_APP_PASSWORD")
fi

notarize() {
    # $1: a .zip or .dmg to submit; waits for Apple's verdict and fails unless it is
    # "Accepted" (printing Apple's log of the problems otherwise).
    local out status id
    log "notarizing $(basename "$1") (this can take several minutes)"
    out="$(xcrun notarytool submit "$1" "${notary_args[@]}" --wait --output-format json)"
    status="$(printf '%s' "$out" | "$PY" -c 'import json, sys; print(json.load(sys.stdin).get("status", ""))')"
    id="$(printf '%s' "$out" | "$PY" -c 'import json, sys; print(json.load(sys.stdin).get("id", ""))')"
    if [[ "$status" != "Accepted" ]]; then
        if [[ -n "$id" ]]; then
            xcrun notarytool log "$id" "${notary_args[@]}" >&2 || true
        fi
        die "notarization of $(basename "$1") ended with status '${status:-unknown}' (submission ${id:-?})"
    fi
    log "notarization accepted (submission $id)"
}

if [[ "$SIGNED" == 1 && ${#notary_args[@]} -gt 0 ]]; then
    ZIP="$BUILD/DFlash-Chat-$VERSION.zip"
    mkdir -p "$BUILD"
    rm -f "$ZIP"
    ditto -c -k --keepParent "$APP" "$ZIP"
    notarize "$ZIP"
    xcrun stapler staple "$APP"
    xcrun stapler validate "$APP"
    spctl --assess --type execute --verbose=2 "$APP"
    NOTARIZED=1
elif [[ "$SIGNED" == 1 ]]; then
    log "no NOTARY_PROFILE or APPLE_ID/APPLE_TEAM_ID/APPLE_APP_PASSWORD: NOT notarized"
fi

# --- 6. DMG --------------------------------------------------------------------------------
log "making $(basename "$DMG")"
STAGE="$BUILD/dmg"
rm -rf "$STAGE"
mkdir -p "$STAGE"
ditto "$APP" "$STAGE/$APP_NAME.app"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "$APP_NAME" -srcfolder "$STAGE" -ov -format UDZO "$DMG" >/dev/null
rm -rf "$STAGE"

if [[ "$SIGNED" == 1 ]]; then
    codesign --force --timestamp --sign "$DEVELOPER_ID" "$DMG"
    if [[ "$NOTARIZED" == 1 ]]; then
        notarize "$DMG"
        xcrun stapler staple "$DMG"
    fi
fi

# --- Summary -------------------------------------------------------------------------------
log "done: $APP"
log "      $DMG"
if [[ "$SIGNED" == 0 ]]; then
    cat <<'EOF'
NOTE: this build is UNSIGNED (ad-hoc signature only) and NOT notarized. It runs on this Mac;
on other Macs Gatekeeper blocks it until the user right-clicks it and chooses Open (or runs
`xattr -dr com.apple.quarantine "DFlash Chat.app"`). Set DEVELOPER_ID and NOTARY_PROFILE to ship.
EOF
elif [[ "$NOTARIZED" == 0 ]]; then
    echo "NOTE: signed with a Developer ID but NOT notarized: Gatekeeper will warn on other Macs."
else
    echo "Signed, notarized and stapled: ready to distribute."
fi
