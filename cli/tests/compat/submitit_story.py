"""submitit, unmodified, against Drover's Slurm commands (run by cli/tests/compat.rs).

Each story prints what it checked; any failure raises and the process exits non-zero with the traceback.
Usage: python submitit_story.py STORY FOLDER   (STORY: function | array | multitask | cancel | preempt)
"""
import os
import sys
import time
from pathlib import Path

import submitit


def executor(folder, **params):
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(timeout_min=10, gpus_per_node=1, cpus_per_task=1, mem_gb=1, **params)
    return ex


def wait_state(job, wanted, timeout_s=60):
    deadline = time.time() + timeout_s
    state = None
    while time.time() < deadline:
        state = job.watcher.get_state(job.job_id, mode="force")
        if state.split(" ")[0] in wanted:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job.job_id} still {state!r}, expected one of {wanted}")


def square_and_log(x, log_dir):
    start = time.time()
    time.sleep(1.5)
    end = time.time()
    env = submitit.JobEnvironment()
    Path(log_dir, f"{x}.span").write_text(f"{start} {end} {env.array_job_id} {env.array_task_id}")
    return x * x


def where_am_i():
    env = submitit.JobEnvironment()
    return {
        "global_rank": env.global_rank,
        "local_rank": env.local_rank,
        "num_tasks": env.num_tasks,
        "num_nodes": env.num_nodes,
        "node": env.node,
        "hostnames": env.hostnames,
        "job_id": env.job_id,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


class Counter(submitit.helpers.Checkpointable):
    """Counts to `total`, one step per 0.2 s, remembering where it is; a preemption checkpoints `self`."""

    def __init__(self):
        self.done = 0
        self.resumed_at = []

    def __call__(self, total, progress_file):
        self.resumed_at.append(self.done)
        while self.done < total:
            time.sleep(0.2)
            self.done += 1
            Path(progress_file).write_text(str(self.done))
        return {"done": self.done, "resumed_at": self.resumed_at,
                "restarts": os.environ.get("SLURM_RESTART_COUNT")}


def story_function(folder):
    job = executor(folder).submit(pow, 2, 10)
    assert job.job_id.isdigit(), job.job_id
    assert job.result() == 1024
    assert wait_state(job, {"COMPLETED"}) == "COMPLETED"
    print(f"function: job {job.job_id} returned 1024 and is COMPLETED")


def story_array(folder):
    log_dir = Path(folder, "spans")
    log_dir.mkdir(parents=True, exist_ok=True)
    ex = executor(folder, slurm_array_parallelism=2)
    jobs = ex.map_array(square_and_log, list(range(8)), [str(log_dir)] * 8)
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1, [j.job_id for j in jobs]
    assert [j.result() for j in jobs] == [x * x for x in range(8)]
    spans = []
    for f in log_dir.glob("*.span"):
        start, end, array_id, task_id = f.read_text().split()
        spans.append((float(start), float(end)))
        assert array_id == jobs[0].job_id.split("_")[0] and task_id == f.stem, (array_id, task_id, f)
    assert len(spans) == 8
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2, f"{most} tasks ran at once with parallelism 2"
    print(f"array: 8 tasks of {jobs[0].job_id.split('_')[0]}, at most {most} at once, results right")


def story_multitask(folder):
    ex = executor(folder, nodes=2, tasks_per_node=2)
    job = ex.submit(where_am_i)
    results = job.results()
    assert len(results) == 4, results
    ranks = sorted(r["global_rank"] for r in results)
    assert ranks == [0, 1, 2, 3], results
    assert sorted((r["node"], r["local_rank"]) for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)], results
    assert all(r["num_tasks"] == 4 and r["num_nodes"] == 2 for r in results), results
    assert all(len(r["hostnames"]) == 2 for r in results), results
    assert all(r["job_id"] == job.job_id for r in results), results
    print(f"multitask: 4 tasks on {results[0]['hostnames']}, ranks and nodes right")


def story_cancel(folder):
    job = executor(folder).submit(time.sleep, 600)
    wait_state(job, {"RUNNING"})
    job.cancel(check=True)
    state = wait_state(job, {"CANCELLED"})
    print(f"cancel: job {job.job_id} is {state}")


def story_preempt(folder):
    progress = Path(folder, "progress")
    job = executor(folder).submit(Counter(), 60, str(progress))
    wait_state(job, {"RUNNING"})
    deadline = time.time() + 60
    while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 10):
        assert time.time() < deadline, "the counter does not advance"
        time.sleep(0.2)
    # What a preemption looks like to submitit: SIGTERM, then its USR2, as its own tests send them.
    job._interrupt()
    result = job.result()
    assert result["done"] == 60, result
    assert len(result["resumed_at"]) == 2 and result["resumed_at"][1] >= 10, result
    assert result["restarts"] == "1", result
    print(f"preempt: job {job.job_id} checkpointed at {result['resumed_at'][1]}, requeued, resumed, finished")


if __name__ == "__main__":
    story, folder = sys.argv[1], sys.argv[2]
    globals()[f"story_{story}"](folder)
