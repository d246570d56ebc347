"""What every module of the selection shares: the columns every takes table has
(``BASE_COLUMNS``) and the error a bad selection raises (``SelectionError``)."""

from __future__ import annotations

# Columns every scores.parquet has, whatever the scorers (see docs in config/README.md).
BASE_COLUMNS = {
    "group_id": "VARCHAR",
    "emotion": "VARCHAR",
    "prompt_id": "VARCHAR",
    "take": "INTEGER",
    "seed": "BIGINT",
    "text": "VARCHAR",
    "flac_path": "VARCHAR",
    "duration_s": "DOUBLE",
    "sample_rate": "INTEGER",
    "channels": "INTEGER",
    "n_frames": "INTEGER",  # codec frames generated (NULL for generators without frames)
    "truncated": "BOOLEAN",  # cut by the frame budget
    "stop_reason": "VARCHAR",  # 'eos' | 'budget' | 'empty'
    "reference_audio": "VARCHAR",
    "generator": "VARCHAR",
    "models": "VARCHAR",
    "models_hash": "VARCHAR",
    "spec_hash": "VARCHAR",
    "bestofn_version": "VARCHAR",
    "host": "VARCHAR",
    "group_generate_s": "DOUBLE",
    "group_restore_s": "DOUBLE",
    "group_score_s": "DOUBLE",
    "group_load_s": "DOUBLE",
    "worker_idle_s": "DOUBLE",
    "score_seconds": "VARCHAR",
    "device": "VARCHAR",
    "worker_slot": "INTEGER",
    "worker_pid": "BIGINT",
    "slurm_job_id": "VARCHAR",  # the SLURM job whose worker wrote the group ('' outside SLURM)
    "started_at": "TIMESTAMPTZ",
    "group_write_s": "DOUBLE",
    "group_wall_s": "DOUBLE",
    "finished_at": "TIMESTAMPTZ",
    # GPU time per stage (CUDA-event spans on the stage's stream; NULL off CUDA) and how the
    # worker overlapped groups ('off', 'host', 'full'); older parquets lack them (NULL)
    "group_generate_gpu_s": "DOUBLE",
    "group_restore_gpu_s": "DOUBLE",
    "group_score_gpu_s": "DOUBLE",
    "score_gpu_seconds": "VARCHAR",
    "overlap": "VARCHAR",
}


class SelectionError(ValueError):
    pass
