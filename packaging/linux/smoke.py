"""Smoke test of a built Linux bundle, from a clean environment (no virtualenv, empty HOME).

    python3 packaging/linux/smoke.py [--offline] [--out DIR] [--wrap CMD] [--deadline S]
                                     [--whisper FOLDER --audio FILE] BUNDLE MODEL.gguf [CHECK...]

CHECK is ``cli``, ``window``, ``serve`` (default: those three) or ``transcribe``. BUNDLE is the folder holding
the ``hearth`` executable. Each check runs the bundle as ``env -i HOME=<empty> PATH=/usr/bin:/bin``
would, so nothing of the build's interpreter is on the path:

- cli: ``hearth --version`` prints the version, ``hearth ls`` exits 0.
- window: ``hearth`` under a private Xvfb (xcb platform) draws its window: the screen, read
  from Xvfb's framebuffer file (``-fbdir``, XWD), is saved as a PNG and must hold a drawn area
  of at least 400x300 pixels with more than a few colours, and the process must still be up.
- serve: ``hearth serve --model MODEL --port 0`` imports and loads the model (through the
  llama.cpp check child, which runs as ``hearth -m app.runtimes.llama.probe_child``), and a
  chat completion on the printed URL answers with tokens.
- transcribe: ``hearth import FOLDER`` (a Whisper model in CTranslate2's format) and ``hearth
  transcribe FILE`` print the speech's text (the speech extra is in the bundle: faster-whisper,
  CTranslate2, PyAV, tokenizers), and ``hearth doctor --json`` says speech to text is available
  and the Dictate button can record (QtMultimedia and its FFmpeg plugin are in the bundle).

``--wrap "qemu-x86_64 -cpu Haswell"`` runs the bundle under that command (the serve check's
log then says which llama.cpp CPU library was loaded: cpu_check.sh), ``--deadline`` gives each
wait that many seconds. ``--offline`` runs everything in a new network namespace with only loopback (``unshare -rn``),
which shows the bundle downloads nothing at its first run. Uses only the standard library, so
the system ``python3`` runs it. Prints one ``SMOKE check seconds`` line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

CLEAN_PATH = "/usr/bin:/bin"
SCREEN = (1280, 800)
DEADLINE_S = 180.0  # generous: a slow, busy machine still gets there (--deadline: more)
WRAP: list[str] = []  # --wrap: a command the bundle runs under (an emulator)


class SmokeFailure(Exception):
    """A check saw the bundle misbehave."""


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """What ``env -i HOME=home PATH=/usr/bin:/bin`` leaves, plus ``extra``."""
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "PATH": CLEAN_PATH, "LANG": "C.UTF-8", **extra}


def wait_for(
    cond: Callable[[], bool],
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float | None = None,
) -> None:
    timeout = DEADLINE_S if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise SmokeFailure(f"the process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise SmokeFailure(f"no {what} within {timeout:.0f}s")
        time.sleep(0.25)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- cli ---------------------------------------------------------------------------------------


def check_cli(bundle: Path, home: Path, version: str | None = None) -> dict[str, object]:
    exe = str(bundle / "hearth")
    env = clean_env(home)
    got = subprocess.run([exe, "--version"], env=env, capture_output=True, text=True, timeout=120)
    if got.returncode != 0 or not got.stdout.startswith("hearth "):
        raise SmokeFailure(f"hearth --version: rc {got.returncode}: {got.stdout}{got.stderr}")
    if version is not None and got.stdout.strip() != f"hearth {version}":
        raise SmokeFailure(f"hearth --version said {got.stdout.strip()!r}, not {version}")
    ls = subprocess.run([exe, "ls"], env=env, capture_output=True, text=True, timeout=120)
    if ls.returncode != 0:
        raise SmokeFailure(f"hearth ls: rc {ls.returncode}: {ls.stdout}{ls.stderr}")
    return {"version": got.stdout.strip(), "ls": ls.stdout.strip()}


# -- window ------------------------------------------------------------------------------------


def check_transcribe(bundle: Path, home: Path, whisper: Path, audio: Path) -> dict[str, object]:
    exe = str(bundle / "hearth")
    env = clean_env(home)

    def run(*args: str) -> str:
        got = subprocess.run(
            [*WRAP, exe, *args], env=env, capture_output=True, text=True, timeout=DEADLINE_S
        )
        if got.returncode != 0:
            raise SmokeFailure(f"hearth {' '.join(args)}: rc {got.returncode}: {got.stderr}")
        return got.stdout.strip()

    model = run("import", str(whisper))
    text = run("transcribe", str(audio), "--model", model)
    if not text:
        raise SmokeFailure("hearth transcribe printed nothing")
    speech = json.loads(run("doctor", "--json"))["speech"]
    if not (speech["available"] and speech["microphone"]):
        raise SmokeFailure(f"hearth doctor: speech to text is not complete: {speech}")
    return {"model": model, "text": text, "speech": speech}


def read_xwd(path: Path) -> tuple[int, int, list[bytes]]:
    """Xvfb's framebuffer file: (width, height, rows of RGB bytes). 24/32-bit ZPixmap only."""
    data = path.read_bytes()
    fields = struct.unpack(">25I", data[:100])
    header_size, _ver, fmt, _depth, width, height = fields[:6]
    byte_order, bpp, bytes_per_line, ncolors = fields[7], fields[11], fields[12], fields[19]
    masks = fields[14:17]
    if fmt != 2 or bpp not in (24, 32):
        raise SmokeFailure(f"unexpected XWD framebuffer (format {fmt}, {bpp} bits per pixel)")
    start = header_size + 12 * ncolors
    step = bpp // 8
    # where each of R, G, B sits in a pixel's bytes (the masks are whole bytes on Xvfb)
    offsets = []
    for m in masks:
        shift = (m & -m).bit_length() - 1
        offsets.append(shift // 8 if byte_order == 0 else step - 1 - shift // 8)
    rows = []
    for y in range(height):
        line = data[start + y * bytes_per_line : start + y * bytes_per_line + width * step]
        out = bytearray(width * 3)
        for i, off in enumerate(offsets):
            out[i::3] = line[off::step]
        rows.append(bytes(out))
    return width, height, rows


def write_png(path: Path, width: int, height: int, rows: list[bytes]) -> None:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    raw = b"".join(b"\x00" + r for r in rows)
    png = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def drawn_area(width: int, height: int, rows: list[bytes]) -> tuple[int, int, int]:
    """(width, height) of the box around every non-black pixel (the root is black), and how
    many distinct colours a sample of the screen has."""
    lit = [y for y, row in enumerate(rows) if row.strip(b"\x00")]
    if not lit:
        return 0, 0, 1
    left = min(len(rows[y]) - len(rows[y].lstrip(b"\x00")) for y in lit) // 3
    right = max(len(rows[y].rstrip(b"\x00")) for y in lit) // 3
    colours = {rows[y][x : x + 3] for y in lit[::8] for x in range(0, width * 3, 12)}
    return right - left, lit[-1] - lit[0] + 1, len(colours)


def start_xvfb(fbdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    xvfb = shutil.which("Xvfb") or "/usr/bin/Xvfb"
    r, w = os.pipe()
    proc = subprocess.Popen(
        [
            xvfb,
            "-displayfd",
            str(w),
            "-screen",
            "0",
            f"{SCREEN[0]}x{SCREEN[1]}x24",
            "-fbdir",
            str(fbdir),
            "-nolisten",
            "tcp",
            "-br",
            "-noreset",
        ],
        pass_fds=(w,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(w)
    with os.fdopen(r) as f:
        display = f.readline().strip()
    if not display:
        proc.kill()
        raise SmokeFailure("Xvfb did not start")
    return proc, f":{display}"


def check_window(bundle: Path, home: Path, out: Path) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    fbdir = Path(tempfile.mkdtemp(prefix="hearth-xvfb-"))
    xvfb, display = start_xvfb(fbdir)
    log = (out / "window-stderr.txt").open("wb")
    app = None
    try:
        env = clean_env(home, DISPLAY=display, XDG_RUNTIME_DIR=str(home / "run"))
        (home / "run").mkdir(mode=0o700, exist_ok=True)
        app = subprocess.Popen([str(bundle / "hearth")], env=env, stdout=log, stderr=log)
        fb = fbdir / "Xvfb_screen0"
        shot: dict[str, object] = {}

        def window_drawn() -> bool:
            w, h, rows = read_xwd(fb)
            bw, bh, colours = drawn_area(w, h, rows)
            shot.update(width=w, height=h, rows=rows, box=(bw, bh), colours=colours)
            return bw >= 400 and bh >= 300 and colours > 8

        wait_for(window_drawn, "window on the X screen", app)
        time.sleep(1.0)  # let the first pages finish painting before the picture is kept
        window_drawn()
        png = out / "bundle-window.png"
        write_png(png, shot["width"], shot["height"], shot["rows"])  # type: ignore[arg-type]
        if app.poll() is not None:
            raise SmokeFailure(f"the app exited ({app.returncode}) after drawing its window")
        return {"screenshot": str(png), "drawn_box": shot["box"], "colours": shot["colours"]}
    finally:
        if app is not None:
            stop(app)
        log.close()
        stop(xvfb)
        shutil.rmtree(fbdir, ignore_errors=True)


# -- serve -------------------------------------------------------------------------------------


def check_serve(bundle: Path, home: Path, model: Path, out: Path) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    env = clean_env(home)
    err_path = out / "serve-stderr.txt"
    with err_path.open("wb") as err:
        # -v: the log says which llama.cpp CPU library this CPU got (libggml-cpu-haswell.so, ...)
        proc = subprocess.Popen(
            [*WRAP, str(bundle / "hearth"), "-v", "serve", "--model", str(model), "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            url = proc.stdout.readline().decode().strip() if proc.stdout else ""  # .../v1
            if not url.startswith("http"):
                raise SmokeFailure(f"hearth serve printed {url!r}, not its URL: {err_path}")
            wait_for(lambda: b" ready (context" in err_path.read_bytes(), "model loaded", proc)
            with urllib.request.urlopen(f"{url}/models", timeout=DEADLINE_S) as r:
                ids = [m["id"] for m in json.load(r)["data"]]
            body = {
                "model": ids[0],
                "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
                "max_tokens": 24,
                "temperature": 0,
            }
            req = urllib.request.Request(
                f"{url}/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            t_chat = time.monotonic()
            with urllib.request.urlopen(req, timeout=DEADLINE_S) as r:
                answer = json.load(r)
            chat_s = time.monotonic() - t_chat
            text = answer["choices"][0]["message"]["content"]
            if not text or answer["usage"]["completion_tokens"] < 1:
                raise SmokeFailure(f"an empty answer: {answer}")
            # the load went through the llama.cpp check child (hearth -m ...): its verdict is kept
            probe = home / ".cache" / "Hearth" / "runtime-probe.json"
            verdicts = json.loads(probe.read_text()) if probe.is_file() else {}
            files = [v for k, v in verdicts.items() if k.startswith("file:")]
            if not files or files[0].get("ok") is not True:
                raise SmokeFailure(f"no check-child verdict on the model in {probe}: {verdicts}")
            log = err_path.read_text(errors="replace")
            cpu = [
                ln.split("CPU backend: ", 1)[1] for ln in log.splitlines() if "CPU backend: " in ln
            ]
            return {
                "url": url,
                "model": ids[0],
                "answer": text,
                "probe_verdict": files[0],
                "cpu_backend": cpu[0].strip() if cpu else None,
                "chat_s": round(chat_s, 1),
            }
        finally:
            stop(proc)


# -- driver ------------------------------------------------------------------------------------


def reexec_offline(argv: list[str]) -> None:
    """Run this script again in a network namespace that has only loopback."""
    if os.environ.get("HEARTH_SMOKE_NETNS") == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False, capture_output=True)
        return
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    if (
        not os.path.exists(unshare)
        or subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode != 0
    ):
        print("SMOKE note: unshare -rn is not permitted here; the checks use the host network")
        return
    cmd = [unshare, "-rn", sys.executable, __file__, *argv]
    env = {
        **os.environ,
        "HEARTH_SMOKE_NETNS": "1",
        "PATH": os.environ.get("PATH", CLEAN_PATH) + ":/usr/sbin:/sbin",
    }
    sys.exit(subprocess.run(cmd, env=env).returncode)


def main(argv: list[str] | None = None) -> int:
    global DEADLINE_S, WRAP
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="no network: unshare -rn, loopback only")
    p.add_argument(
        "--out", type=Path, default=None, help="screenshot and logs (default: a temp dir)"
    )
    p.add_argument("--version", default=None, help="the version --version must print")
    p.add_argument("--wrap", default="", help="run the bundle under this command (an emulator)")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for each wait")
    p.add_argument("--whisper", type=Path, default=None, help="a Whisper folder (transcribe)")
    p.add_argument("--audio", type=Path, default=None, help="a spoken audio file (transcribe)")
    p.add_argument("bundle", type=Path)
    p.add_argument("model", type=Path)
    p.add_argument("checks", nargs="*", default=["cli", "window", "serve"])
    args = p.parse_args(argv)
    DEADLINE_S, WRAP = args.deadline, shlex.split(args.wrap)
    if args.offline:
        reexec_offline(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="hearth-smoke-"))
    homes = Path(tempfile.mkdtemp(prefix="hearth-smoke-home-"))
    failed = 0
    t_all = time.monotonic()
    for check in args.checks:
        home = homes / check  # an empty HOME per check: each is a first run
        t0 = time.monotonic()
        try:
            if check == "cli":
                result = check_cli(args.bundle, home, args.version)
            elif check == "window":
                result = check_window(args.bundle, home, out)
            elif check == "serve":
                result = check_serve(args.bundle, home, args.model.resolve(), out)
            elif check == "transcribe":
                if args.whisper is None or args.audio is None:
                    raise SmokeFailure("the transcribe check needs --whisper and --audio")
                result = check_transcribe(
                    args.bundle, home, args.whisper.resolve(), args.audio.resolve()
                )
            else:
                raise SmokeFailure(f"unknown check {check!r}")
        except (SmokeFailure, OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
            failed += 1
            print(f"SMOKE {check} FAILED after {time.monotonic() - t0:.1f}s: {e}", flush=True)
            continue
        print(f"SMOKE {check} {time.monotonic() - t0:.1f}s {json.dumps(result)}", flush=True)
    net = "none (unshare -rn, loopback only)" if os.environ.get("HEARTH_SMOKE_NETNS") else "host"
    print(f"SMOKE total {time.monotonic() - t_all:.1f}s network: {net} out: {out}", flush=True)
    shutil.rmtree(homes, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
