"""Weight-file hashes for provenance: threaded, in order, memoised, and re-hashed on change."""

import hashlib

from bestofn.util.hashing import dir_digest, hash_files


def test_hash_files_match_hashlib_in_order_and_use_the_memo(tmp_path):
    files = []
    for i in range(5):
        f = tmp_path / "ckpt" / f"model-{i:05d}.safetensors"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(bytes([i]) * (300_000 + i))
        files.append(f)
    want = {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    memo = tmp_path / "memo"
    got = hash_files(reversed(files), memo)
    assert list(got) == list(reversed(want))  # the callers' order, not completion order
    assert got == want
    assert len(list(memo.iterdir())) == 5
    # a rewritten file (new size and mtime) is hashed again, not served from the memo
    files[2].write_bytes(b"other")
    again = hash_files(files, memo)
    assert again[str(files[2])] == hashlib.sha256(b"other").hexdigest()
    assert {k: v for k, v in again.items() if k != str(files[2])} == {
        k: v for k, v in want.items() if k != str(files[2])
    }
    assert dir_digest(tmp_path / "ckpt") == {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files
    }
