"""What several test files share: the repository's paths, a tiny project, the snakemake and
`bestofn verify` commands, hand-made scores.parquet files, the hub stand-in and headless
Chromium. Test files import from here (tests/ is on pytest's `pythonpath`), never from one
another."""

import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import yaml

from bestofn.worker.client.group_job import _pid_alive, _read_pid
from bestofn.worker.client.runtime import default_state_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's console scripts: snakemake, bestofn
DATA = REPO / "tests" / "data"
EXPECTED = REPO / "tests" / "expected"


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    return path


def tiny_config(**overrides) -> dict:
    """A fast config: piper generator, no restoration, duration + whisper scorers."""
    config = {
        "emotions": "config/emotions.tsv",
        "prompts": "config/prompts.tsv",
        "results": "results",
        "takes": 2,
        "seed": 7,
        "models": {
            "generator": {"backend": "piper"},
            "restorer": {"backend": "identity"},
            "scorers": [{"backend": "duration"}],
        },
        "selection": {"filter": "words_per_s > 0.5", "score": "-abs(words_per_s - 2.5)"},
    }
    config.update(overrides)
    return config


def make_tiny_project(root: Path) -> Path:
    """config/ (tiny config, 2 emotions x 2 prompts) and a voice in ``root``."""
    (root / "config" / "voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    write_tsv(
        root / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/ref.flac"], ["happy", "A happy voice.", ""]],
    )
    write_tsv(
        root / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning to you."], ["p2", "It is nine o'clock."]],
    )
    (root / "config/config.yaml").write_text(yaml.safe_dump(tiny_config()))
    return root


# --- the workflow through its commands ---------------------------------------------------------


def snakemake(project: Path, *args: str, check=True) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "snakemake"),
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project),
        "--profile", str(REPO / "profiles/local"),
        *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def planned_jobs(project: Path) -> dict[str, int]:
    """Job counts by rule from a dry run's 'Job stats' table."""
    out = snakemake(project, "-n", "--quiet", "rules").stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def verify(project: Path) -> str:
    proc = subprocess.run(
        [str(BIN / "bestofn"), "verify", "results"], cwd=project, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# --- hand-made scores.parquet ------------------------------------------------------------------


def scores_table(group_id, columns: dict, results: str = "results", duration_s=2.0, text=None):
    """One group's scores table: the columns every group has, with ``columns`` (name -> one
    value per take) after ``duration_s``; a ``text`` column where given."""
    n = len(next(iter(columns.values())))
    emotion, prompt_id = group_id.split("/")
    return pa.table(
        {
            "group_id": [group_id] * n,
            "emotion": [emotion] * n,
            "prompt_id": [prompt_id] * n,
            "take": pa.array(range(n), pa.int32()),
            **({"text": [text] * n} if text is not None else {}),
            "flac_path": [f"{results}/groups/{group_id}/takes/{i:03d}.flac" for i in range(n)],
            "duration_s": [duration_s] * n,
            **columns,
            "device": ["cpu"] * n,
            **{
                f"group_{s}_s": [1.0] * n
                for s in ("generate", "restore", "score", "load", "write", "wall")
            },
            "worker_idle_s": [0.0] * n,
            "started_at": pa.array([0] * n, pa.timestamp("s", tz="UTC")),
            "finished_at": pa.array([10] * n, pa.timestamp("s", tz="UTC")),
        }
    )


def scores_parquet(tmp_path, group_id, columns: dict):
    """One group's scores.parquet (``scores_table``) outside a results folder."""
    path = tmp_path / f"{group_id.replace('/', '_')}.parquet"
    pq.write_table(scores_table(group_id, columns), path)
    return path


def group_parquet(tmp_path, group_id, wers, quality):
    """One group's scores.parquet with a ``wer`` and a ``quality`` column."""
    return scores_parquet(tmp_path, group_id, {"wer": wers, "quality": quality})


SR = 8000  # the sample rate of write_group's takes


def write_group(results: Path, group_id: str, columns: dict, flac: bool = False) -> Path:
    """One group's scores.parquet (and, with ``flac``, its takes as short FLACs) in the
    results layout."""
    emotion, prompt_id = group_id.split("/")
    n = len(next(iter(columns.values())))
    gdir = results / "groups" / emotion / prompt_id
    (gdir / "takes").mkdir(parents=True, exist_ok=True)
    if flac:
        t = np.arange(int(0.3 * SR)) / SR
        for i in range(n):
            sf.write(gdir / "takes" / f"{i:03d}.flac", 0.2 * np.sin(2 * np.pi * 220 * (i + 1) * t),
                     SR, subtype="PCM_16")  # fmt: skip
    table = scores_table(group_id, columns, results.name, duration_s=0.3,
                         text=f"Prompt {prompt_id} & <friends>.")  # fmt: skip
    pq.write_table(table, gdir / "scores.parquet")
    return gdir / "scores.parquet"


def trade_off_results(results: Path, flac: bool = False) -> list[Path]:
    """12 groups x 6 takes where the score (``quality``) trades against held-out
    ``naturalness`` (higher is better) and goes along with held-out ``clarity``; one group
    where no take passes the filter."""
    rng = np.random.default_rng(0)
    files = []
    for emotion in ("calm", "happy"):
        for p in range(6):
            quality = rng.normal(size=6)
            files.append(
                write_group(
                    results,
                    f"{emotion}/p{p}",
                    {
                        "wer": [0.0, 0.05, 0.2, 0.0, 0.0, 0.01],
                        "quality": quality,
                        "naturalness": -quality + 0.1 * rng.normal(size=6),
                        "clarity": quality + 0.1 * rng.normal(size=6),
                        "transcript": [f"heard {i}" for i in range(6)],
                    },
                    flac,
                )
            )
    files.append(
        write_group(
            results,
            "sad/p0",
            {
                "wer": [0.5, 0.6, 0.7],
                "quality": [1.0, 2.0, 3.0],
                "naturalness": [0.0, 0.0, 0.0],
                "clarity": [0.0, 0.0, 0.0],
                "transcript": ["a", "b", "c"],
            },
            flac,
        )
    )
    return files


HELD_OUT = [
    {"column": "naturalness", "better": "higher"},
    {"column": "clarity", "better": "higher"},
]  # trade_off_results's held-out columns


# --- headless Chromium -------------------------------------------------------------------------


def chromium() -> str:
    """The headless Chromium binary that .ci/chromium-up.sh installs or finds."""
    proc = subprocess.run(
        ["bash", str(REPO / ".ci/chromium-up.sh")], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f".ci/chromium-up.sh failed:\n{proc.stderr[-3000:]}"
    return proc.stdout.strip().splitlines()[-1]


# --- a Hugging Face hub stand-in on loopback ---------------------------------------------------


def sha(repo: str) -> str:
    """A repo's commit: one of its own (snapshot_download keeps a tree listing per commit in a
    local_dir that two repos share here)."""
    return hashlib.sha1(repo.encode()).hexdigest()


class Hub(BaseHTTPRequestHandler):
    """Serves ``files`` (repo -> {path: bytes}) the way huggingface_hub's snapshot_download
    asks for them: revision info, the tree listing, HEAD and GET of each file; records
    ``requests``. ``files`` is each repo's default branch, at commit ``heads[repo]`` (default:
    ``sha(repo)``); ``history`` (repo -> {commit: {path: bytes}}) adds older commits, fetched by
    their sha."""

    files: dict = {}
    heads: dict = {}
    history: dict = {}
    requests: list = []

    @classmethod
    def serving(cls, files: dict, heads: dict | None = None, history: dict | None = None):
        """Set what the stand-in serves (class state: one stand-in per test at a time)."""
        cls.files, cls.heads, cls.history, cls.requests = files, heads or {}, history or {}, []
        return cls

    def head(self, repo: str) -> str:
        return self.heads.get(repo, sha(repo))

    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: bytes, ctype="application/json", head=False, extra=None):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _commit(self, repo: str, rev: str) -> tuple[str, dict] | None:
        """(commit, files) that a revision names: an older commit by its sha, else the head."""
        older = self.history.get(repo, {})
        if rev in older:
            return rev, older[rev]
        if rev in ("main", self.head(repo)):
            return self.head(repo), self.files[repo]
        return None

    def _route(self, head=False):
        # the hub quotes file names (Empathic-Insight's heads hold '&'); the listing does not
        path = urllib.parse.unquote(self.path.split("?")[0])
        self.requests.append((self.command, path))
        # a dataset repo is served as a model repo is, under its own URL prefixes
        path = path.replace("/api/datasets/", "/api/models/", 1).removeprefix("/datasets")
        for repo in self.files:
            if path == f"/api/models/{repo}":  # model_info without a revision: the head
                body = json.dumps({"id": repo, "sha": self.head(repo)}).encode()
                return self._send(body, head=head)
            for prefix in (f"/api/models/{repo}/revision/", f"/api/models/{repo}/tree/",
                           f"/{repo}/resolve/"):  # fmt: skip
                if not path.startswith(prefix):
                    continue
                rev, _, name = path[len(prefix) :].partition("/")
                found = self._commit(repo, rev)
                if found is None:
                    break
                commit, files = found
                if prefix.endswith("/revision/"):
                    body = json.dumps({"id": repo, "sha": commit}).encode()
                    return self._send(body, head=head)
                if prefix.endswith("/tree/"):
                    listing = [
                        {"type": "file", "path": p, "size": len(b),
                         "oid": hashlib.sha1(b).hexdigest()}
                        for p, b in files.items()
                    ]  # fmt: skip
                    return self._send(json.dumps(listing).encode(), head=head)
                body = files[name]
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
                return self._send(body, "application/octet-stream", head, headers)
        self.send_response(404)
        self.send_header(
            "X-Error-Code", "RevisionNotFound" if self._known(path) else "RepoNotFound"
        )
        self.end_headers()

    def do_GET(self):
        self._route()

    def do_HEAD(self):
        self._route(head=True)


# --- workers and `bestofn serve` -------------------------------------------------------------


def gone(pid, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def make_project(root: Path, **runtime) -> Path:
    (root / "config/voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    write_tsv(
        root / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/ref.flac"], ["happy", "A happy voice.", ""]],
    )
    write_tsv(root / "config/prompts.tsv", ["prompt_id", "text"], [["p1", "Good morning."]])
    config = tiny_config(max_words=40, runtime={"idle_timeout_s": 120, **runtime})
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    return root


class Server:
    """`bestofn serve --port 0` in a project directory; its worker is killed at the end."""

    def __init__(self, root: Path, *args: str, key: str | None = None):
        self.root, self.key = root, key
        cmd = [sys.executable, "-m", "bestofn.cli", "serve", "--port", "0", *args]
        if key:
            cmd += ["--api-key", key]
        self.proc = subprocess.Popen(
            cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                if "listening on" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.close()
            raise AssertionError("server did not start:\n" + "".join(self.lines))
        line = next(x for x in self.lines if "listening on" in x)
        self.port = int(line.split("http://127.0.0.1:")[1].split()[0])
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = default_state_dir(root)

    def client(self, api_key: str | None = None):
        import openai

        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key or self.key or "unused", max_retries=0,
            timeout=120,
        )  # fmt: skip

    def get(self, path: str, key: str | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {key or self.key}"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def health(self) -> dict:
        status, body = self.get("/health")
        assert status == 200
        return body

    def wait_health(self, what, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if what(h):
                return h
            time.sleep(0.25)
        raise AssertionError(f"/health never got there in {timeout} s: {h}")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        pid = _read_pid(Path(self.state) / "slot0.pid")
        if pid and _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def speak(client, text: str, voice: str = "calm", fmt: str = "wav", seed: int = 0) -> bytes:
    return client.audio.speech.create(
        model="bestofn", voice=voice, input=text, response_format=fmt, extra_body={"seed": seed}
    ).content


def moss_speak(server, text: str, seed: int, fmt: str = "pcm") -> bytes:
    """A streamed request through the openai client; a stream that stalls fails after 60 s."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                           timeout=60)  # fmt: skip
    with client.audio.speech.with_streaming_response.create(
        model="bestofn", voice="default", input=text, response_format=fmt,
        extra_body={"seed": seed},
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        return b"".join(resp.iter_bytes())


def copy_fake_weights(weights: Path, dest: Path) -> Path:
    """A copy of a `bestofn fake-weights` tree at ``dest`` whose config and sheets name the
    copy (the writer puts absolute paths in them)."""
    shutil.copytree(weights, dest, symlinks=True)
    for name in ("config.yaml", "emotions.tsv", "prompts.tsv"):
        path = dest / name
        if path.is_file():
            path.write_text(path.read_text().replace(str(weights), str(dest)))
    return dest


@contextmanager
def held_elsewhere(lock):
    """``lock`` held by another thread of this process for the block: what a forked child
    would inherit held, by no thread of its own."""
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        yield
    finally:
        done.set()
        holder.join()
