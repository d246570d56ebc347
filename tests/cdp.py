"""A small Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (fds 3 and 4,
NUL-separated JSON): enough to load a page, click, type, press keys, read values, take a
screenshot and catch a download in headless Chromium, with the standard library only."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, binary: str, profile: Path, downloads: Path, size=(1280, 1600)):
        profile.mkdir(parents=True, exist_ok=True)
        downloads.mkdir(parents=True, exist_ok=True)
        self.downloads = downloads
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()

        def to_3_and_4():  # Chromium reads commands on fd 3 and answers on fd 4
            os.dup2(cmd_r, 100)
            os.dup2(resp_w, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        cmd = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--remote-debugging-pipe", f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}", "--hide-scrollbars", "about:blank",
        ]  # fmt: skip
        self._log = profile / "stderr.log"
        with open(self._log, "wb") as log:  # a file, not a pipe: a full pipe would stall it
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                pass_fds=(3, 4),
                preexec_fn=to_3_and_4,
            )
        os.close(cmd_r)
        os.close(resp_w)
        self._next = 0
        self._replies: dict[int, queue.Queue] = {}
        self.events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self.session = None

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._resp_r, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in self._replies:
                    self._replies[msg["id"]].put(msg)
                else:
                    self.events.put(msg)

    def send(self, method: str, params: dict | None = None, session: bool = True, timeout=30):
        with self._lock:
            self._next += 1
            ident = self._next
            self._replies[ident] = queue.Queue()
        msg = {"id": ident, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        try:
            reply = self._replies[ident].get(timeout=timeout)
        except queue.Empty:
            raise CDPError(f"{method}: no reply in {timeout} s") from None
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, timeout=30, where=lambda p: True) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if msg.get("method") == method and where(msg.get("params", {})):
                return msg["params"]
        raise CDPError(f"no {method} event in {timeout} s")

    def open(self, url: str) -> None:
        self.send(
            "Browser.setDownloadBehavior",
            {"behavior": "allow", "downloadPath": str(self.downloads), "eventsEnabled": True},
            session=False,
        )
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True},
            session=False,
        )["sessionId"]  # fmt: skip
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise CDPError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the element (scrolled into view first)."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            "return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", {"text": text})

    def press(self, key: str) -> None:
        """One key press (keyDown with its text, keyUp) as a keyboard would send it."""
        special = {"ArrowLeft": 37, "ArrowRight": 39, "ArrowDown": 40, "Escape": 27}
        if key in special:
            down = {"key": key, "code": key, "windowsVirtualKeyCode": special[key]}
        else:
            code = f"Digit{key}" if key.isdigit() else f"Key{key.upper()}"
            down = {"key": key, "code": code, "text": key, "unmodifiedText": key,
                    "windowsVirtualKeyCode": ord(key.upper())}  # fmt: skip
        self.send("Input.dispatchKeyEvent", {"type": "keyDown", **down})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **down})

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def wait_download(self, timeout=30) -> Path:
        self.wait_event(
            "Browser.downloadProgress", timeout, lambda p: p.get("state") == "completed"
        )
        files = [p for p in self.downloads.iterdir() if not p.name.endswith(".crdownload")]
        if len(files) != 1:
            raise CDPError(f"expected one download in {self.downloads}, found {files}")
        return files[0]

    def close(self) -> str:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        return self._log.read_text(errors="replace")[-3000:]
