"""Step time of verl's v1 trainer vs its legacy trainer on this CPU machine (issue 26, part 3).

    .venv/bin/python bench/trainer_paths.py [--steps 5] [--reps 2] [--out trainer_paths.json]
                                            [--paths v1,v1-poll,legacy] [--tq-site /tmp/tq_site]
                                            [--model tiny-test]

Each repetition runs verl's own entry point, ``python -m verl.trainer.main_ppo`` (not agentevolver's), once
per trainer path on the same tiny GRPO workload; the order reverses between repetitions so that a change of
load does not always hit the same path:

* ``v1`` (``trainer.use_v1=true``): ``TaskRunnerV1`` -> ``PPOTrainerSync`` (``verl/trainer/ppo/v1/
  trainer_sync.py``), batches kept in TransferQueue, rollout by ``AgentLoopManagerTQ``;
* ``v1-poll``: the same with a 0.1 s replay-buffer poll. verl's sync ``ReplayBuffer.sample`` checks
  TransferQueue for finished rollouts every ``poll_interval`` seconds, hard-coded to 2.0 (no config key), so
  v1's ``gen`` stage ends on a 2 s tick; this variant sets it through verl's own hook,
  ``trainer.v1.sampler.custom_sampler`` (a 6-line subclass written next to the dataset), to show what v1
  costs without that wait;
* ``legacy`` (``trainer.use_v1=false``): ``main_ppo_v0.TaskRunner`` -> ``RayPPOTrainer`` (what AgentEvolver
  subclasses).

The workload: the model (default ``tiny-test``, the project's built-in tiny Qwen2), a parquet file of
single-turn chat prompts in verl's RLHF format, a custom reward file (a checksum of the response, so that
the samples of a GRPO group score differently), verl's ``single_turn_agent`` loop, and the CPU settings of
``config/backend/cpu.yaml`` and ``examples/quickstart.yaml`` given as verl overrides (cpu platform from the
agentevolver verl plugin, ``hf`` rollout, FSDP2 in fp32, sdpa attention, no reference model, the rollout's
log-probs as the old policy's). Validation and checkpoints are off.

Numbers: ``timing_s/step`` of every step from verl's ``file`` logger (``VERL_FILE_LOGGER_PATH``); step 1 is
the warm-up, the median of steps 2.. is the step time; "total" is the wall time of the whole process (Ray
start, worker and model set-up, all steps, shut-down). The ratio is v1 / legacy of the medians over the
repetitions. The load average is printed before and after.

On a machine shared with other jobs the wall time swings with their load, so CPU time is measured too: the
user + system seconds of the run's whole process tree (driver, Ray's daemons and workers), polled once a
second. "CPU s per later step" is the tree's CPU time between the metrics lines of step 1 and of the last
step, divided by the steps in between: the work one step costs, which hardly depends on the load (time a
trainer spends waiting, e.g. in sleeps between polls, shows in the wall time only).

TransferQueue is not a project dependency. Install it outside the venv for this measurement:
``.venv/bin/pip install --no-deps --target /tmp/tq_site transferqueue==0.1.11 msgspec pyzmq``; the v1 runs get
``PYTHONPATH=<tq-site>`` (the Ray workers, started locally by the driver, inherit it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("v1", "v1-poll", "legacy")
V1_PATHS = ("v1", "v1-poll")
POLL_INTERVAL = 0.1  # seconds, v1-poll's replay-buffer poll (verl's ReplayBuffer default: 2.0)
TQ_INSTALL = ".venv/bin/pip install --no-deps --target {site} transferqueue==0.1.11 msgspec pyzmq"

REWARD_SOURCE = '''
"""Bench reward: a deterministic pseudo-random score of the response text (GRPO needs varied rewards)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return (sum(ord(c) for c in solution_str) % 97) / 97.0
'''

SAMPLER_SOURCE = '''
"""v1-poll: verl's sync ReplayBuffer with a shorter poll than its hard-coded 2 s (through verl's custom-sampler hook)."""
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class ShortPollReplayBuffer(ReplayBuffer):
    def __init__(self, *args, sampler_kwargs, **kwargs):
        poll_interval = float(sampler_kwargs.get("poll_interval", 0.1))
        super().__init__(*args, sampler_kwargs=sampler_kwargs, poll_interval=poll_interval, **kwargs)
'''

QUESTIONS = [
    "Name a colour.", "Count to three.", "Say hello.", "What is two plus two?",
    "Name an animal.", "Spell cat.", "Name a fruit.", "What day comes after Monday?",
]


def write_workload(folder: Path) -> tuple[Path, Path]:
    """The parquet dataset (verl's RLHF format), the reward file and v1-poll's sampler, in ``folder``."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "data_source": "trainer_paths_bench",
            "prompt": [{"role": "user", "content": question}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": "unused"},
            "extra_info": {"index": index, "split": "train"},
        }
        for index, question in enumerate(QUESTIONS)
    ]
    data = folder / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    reward = folder / "reward.py"
    reward.write_text(REWARD_SOURCE)
    (folder / "short_poll_sampler.py").write_text(SAMPLER_SOURCE)
    return data, reward


def overrides(path: str, args: argparse.Namespace, model: str, data: Path, reward: Path, run_dir: Path) -> list[str]:
    """verl overrides of one run: the same workload for both paths, only ``trainer.use_v1`` (and TQ) differ."""
    fp32 = ["param_dtype=fp32", "reduce_dtype=fp32", "buffer_dtype=fp32"]
    common = [
        f"trainer.use_v1={'true' if path in V1_PATHS else 'false'}",
        # workload
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={args.batch}",
        "data.max_prompt_length=128",
        f"data.max_response_length={args.response_length}",
        "data.dataloader_num_workers=0",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.response_length={args.response_length}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.batch * args.n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.batch * args.n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.batch * args.n}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.use_kl_loss=false",  # quickstart: no reference model
        "algorithm.use_kl_in_reward=false",
        "algorithm.rollout_correction.bypass_mode=true",  # quickstart: rollout log-probs as the old policy's
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        # CPU backend (config/backend/cpu.yaml)
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.use_prefix_grouper=true",
        *(f"+actor_rollout_ref.actor.fsdp_config.mixed_precision.{kv}" for kv in fp32),
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"ray_kwargs.ray_init.num_cpus={args.ray_cpus}",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=false",
        f"+ray_kwargs.ray_init.runtime_env.py_executable={sys.executable}",
        # run length and logging
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        "trainer.logger=[console,file]",
        "trainer.project_name=trainer_paths_bench",
        f"trainer.experiment_name={path}",
    ]
    if path in V1_PATHS:
        # ../shared/research/verl-0.9.1-on-cpu.md: with the default 8 storage units tq.init hangs on a few cores.
        common.append("transfer_queue.backend.SimpleStorage.num_data_storage_units=1")
    if path == "v1-poll":
        common += [
            f"trainer.v1.sampler.custom_sampler.path={data.parent / 'short_poll_sampler.py'}",
            "trainer.v1.sampler.custom_sampler.name=ShortPollReplayBuffer",
            f"+trainer.v1.sampler.sampler_kwargs.poll_interval={POLL_INTERVAL}",
        ]
    return common


def run_env(path: str, args: argparse.Namespace, metrics_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray cluster per run
    env["VERL_PLATFORM"] = "cpu"
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_file)
    env["TOKENIZERS_PARALLELISM"] = "false"
    pythonpath = [str(ROOT)]
    if path in V1_PATHS:
        pythonpath.insert(0, str(args.tq_site))
    if env.get("PYTHONPATH"):
        pythonpath.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return env


def transfer_queue_importable(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether ``import transfer_queue`` works in the environment the v1 runs get."""
    env = run_env("v1", args, Path(os.devnull))
    done = subprocess.run(
        [sys.executable, "-c", "import transfer_queue, zmq, msgspec; print(transfer_queue.__file__)"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else ""


STAGES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights")


def load_steps(metrics_file: Path) -> dict[int, dict[str, float]]:
    """``timing_s/<stage>`` per step from verl's file logger (one JSON object per line); ``step`` always set."""
    steps = {}
    if not metrics_file.exists():
        return steps
    for line in metrics_file.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        data = record.get("data", {})
        if data.get("timing_s/step") is not None:
            steps[int(record["step"])] = {
                name: float(data[f"timing_s/{name}"]) for name in ("step", *STAGES) if f"timing_s/{name}" in data
            }
    return steps


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


class TreeCPU:
    """CPU seconds (user + system) of a process and all its descendants (the Ray cluster it starts).

    Polled once a second: each process's last reading counts, so one that ends between two polls loses at
    most a second. Unlike wall time, this hardly depends on what else runs on the machine.
    """

    def __init__(self, pid: int) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._seen: dict[tuple[int, float], float] = {}

    def poll(self) -> None:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            return
        for process in processes:
            try:
                times = process.cpu_times()
                self._seen[(process.pid, process.create_time())] = times.user + times.system
            except self._psutil.Error:
                continue

    @property
    def total(self) -> float:
        return sum(self._seen.values())


def run_once(path: str, rep: int, args: argparse.Namespace, model: str, data: Path, reward: Path) -> dict:
    run_dir = args.workdir / f"rep{rep}_{path}"
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    log_file = run_dir / "log.txt"
    command = [sys.executable, "-m", "verl.trainer.main_ppo",
               *overrides(path, args, model, data, reward, run_dir)]
    started = time.monotonic()
    with log_file.open("w") as log:
        process = subprocess.Popen(command, env=run_env(path, args, metrics_file), stdout=log,
                                   stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True)
        cpu = TreeCPU(process.pid)
        cpu_at_step: dict[int, float] = {}  # tree CPU seconds when step k's metrics line appeared
        returncode = None
        while time.monotonic() - started < args.timeout:
            cpu.poll()
            logged = count_lines(metrics_file)
            if logged and logged not in cpu_at_step:
                cpu_at_step[logged] = cpu.total
            try:
                returncode = process.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        if returncode is None:  # ran past --timeout: stop this run's process group (ours alone)
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    total = time.monotonic() - started
    steps = load_steps(metrics_file)
    later = [steps[s]["step"] for s in sorted(steps) if s >= 2]
    stages = {
        name: statistics.median(values)
        for name in STAGES
        if (values := [steps[s][name] for s in sorted(steps) if s >= 2 and name in steps[s]])
    }
    last = max(cpu_at_step, default=0)
    cpu_per_step = (cpu_at_step[last] - cpu_at_step[1]) / (last - 1) if last >= 2 and 1 in cpu_at_step else None
    result = {
        "path": path, "rep": rep, "returncode": returncode, "total_s": round(total, 2),
        "cpu_s": round(cpu.total, 1), "cpu_per_later_step_s": cpu_per_step,
        "cpu_at_step_s": {str(k): round(v, 1) for k, v in sorted(cpu_at_step.items())},
        "steps": {str(s): {k: round(v, 3) for k, v in t.items()} for s, t in sorted(steps.items())},
        "step1_s": steps[1]["step"] if 1 in steps else None,
        "median_later_s": statistics.median(later) if later else None,
        "median_later_stages_s": stages,
        "log": str(log_file),
    }
    ok = returncode == 0 and len(steps) == args.steps
    status = "ok" if ok else ("timed out" if returncode is None else f"exit {returncode}")
    median = f"{result['median_later_s']:.2f}" if later else "-"
    print(f"  rep {rep} {path:7s}: {status}, {len(steps)} steps, median later step {median} s, "
          f"total {total:.1f} s, CPU {cpu.total:.0f} s (log: {log_file}); {uptime()}", flush=True)
    if not ok:
        tail = log_file.read_text(errors="replace").splitlines()[-40:]
        print("    last lines of the log:\n    " + "\n    ".join(tail), flush=True)
    return result


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarise(results: list[dict]) -> dict[str, dict]:
    summary = {}
    for path in PATHS:
        runs = [r for r in results if r["path"] == path and r["median_later_s"] is not None]
        if not runs:
            continue
        summary[path] = {
            "runs": len(runs),
            "step1_s": statistics.median(r["step1_s"] for r in runs),
            "median_later_s": statistics.median(r["median_later_s"] for r in runs),
            "total_s": statistics.median(r["total_s"] for r in runs),
            "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "cpu_per_later_step_s": statistics.median(
                r["cpu_per_later_step_s"] for r in runs if r["cpu_per_later_step_s"] is not None
            ) if any(r["cpu_per_later_step_s"] is not None for r in runs) else None,
            "stages_s": {
                name: statistics.median(r["median_later_stages_s"][name] for r in runs)
                for name in STAGES
                if all(name in r["median_later_stages_s"] for r in runs)
            },
        }
    legacy = summary.get("legacy")
    for entry in summary.values():
        entry["ratio_step"] = entry["median_later_s"] / legacy["median_later_s"] if legacy else None
        entry["ratio_total"] = entry["total_s"] / legacy["total_s"] if legacy else None
        entry["ratio_cpu"] = entry["cpu_s"] / legacy["cpu_s"] if legacy else None
        both = legacy and entry["cpu_per_later_step_s"] and legacy["cpu_per_later_step_s"]
        entry["ratio_cpu_step"] = entry["cpu_per_later_step_s"] / legacy["cpu_per_later_step_s"] if both else None
    return summary


def print_table(results: list[dict], summary: dict[str, dict]) -> None:
    print("\n| path | rep | step-1 s | median later step s | total s | CPU s per later step | total CPU s "
          "| step ratio vs legacy |")
    print("|---|---|---|---|---|---|---|---|")
    legacy = summary.get("legacy")
    for r in results:
        ratio = r["median_later_s"] / legacy["median_later_s"] if legacy and r["median_later_s"] else None
        print(f"| {r['path']} | {r['rep']} | {fmt(r['step1_s'])} | {fmt(r['median_later_s'])} | "
              f"{fmt(r['total_s'], 1)} | {fmt(r['cpu_per_later_step_s'], 1)} | {fmt(r['cpu_s'], 0)} | {fmt(ratio)} |")
    for path, s in summary.items():
        print(f"| **{path}** (median of {s['runs']}) | | {fmt(s['step1_s'])} | {fmt(s['median_later_s'])} | "
              f"{fmt(s['total_s'], 1)} | {fmt(s['cpu_per_later_step_s'], 1)} | {fmt(s['cpu_s'], 0)} | "
              f"{fmt(s['ratio_step'])} (total {fmt(s['ratio_total'])}, CPU per step {fmt(s['ratio_cpu_step'])}, "
              f"total CPU {fmt(s['ratio_cpu'])}) |")
    print("\nStages of steps 2.. (median s; verl's timing_s/<stage>):\n")
    print("| path | " + " | ".join(STAGES) + " | step |")
    print("|---|" + "---|" * (len(STAGES) + 1))
    for path, s in summary.items():
        cells = [fmt(s["stages_s"].get(name)) for name in STAGES]
        print(f"| {path} | " + " | ".join(cells) + f" | {fmt(s['median_later_s'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per run (step 1 is the warm-up)")
    parser.add_argument("--reps", type=int, default=2, help="repetitions; each runs both paths, alternating order")
    parser.add_argument("--out", type=Path, help="write the raw numbers as JSON here")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma list of paths to run: " + ", ".join(PATHS))
    parser.add_argument("--model", default="tiny-test", help="model name (agentevolver.models) or a local folder")
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="rollouts per prompt (actor_rollout_ref.rollout.n)")
    parser.add_argument("--response-length", type=int, default=32, help="max response tokens")
    parser.add_argument("--ray-cpus", type=int, default=8, help="logical Ray CPUs (ray_kwargs.ray_init.num_cpus)")
    parser.add_argument("--tq-site", type=Path, default=Path("/tmp/tq_site"),
                        help="folder that holds TransferQueue (put on PYTHONPATH for the v1 runs)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/trainer_paths_bench"),
                        help="dataset, reward file, logs and metrics of every run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before one run is stopped")
    args = parser.parse_args()
    paths = [p for p in PATHS if p in args.paths.split(",")]
    if not paths or args.steps < 2 or args.reps < 1:
        parser.error(f"need at least one of {', '.join(PATHS)} in --paths, --steps >= 2 and --reps >= 1")
    args.workdir = args.workdir.resolve()
    args.tq_site = args.tq_site.resolve()

    if any(path in V1_PATHS for path in paths):
        ok, detail = transfer_queue_importable(args)
        if not ok:
            print(f"transfer_queue cannot be imported with PYTHONPATH={args.tq_site} ({detail}).\n"
                  "verl's v1 trainer needs TransferQueue, which is not a project dependency. Install it outside "
                  f"the venv for this measurement:\n  {TQ_INSTALL.format(site=args.tq_site)}\n"
                  "(or point --tq-site at a folder that holds it; --paths legacy runs the legacy trainer alone).",
                  file=sys.stderr)
            raise SystemExit(2)
        print(f"transfer_queue: {detail}")

    sys.path.insert(0, str(ROOT))
    from agentevolver.models import resolve_model_path

    model = args.model if Path(args.model).is_dir() else str(resolve_model_path(args.model))
    data, reward = write_workload(args.workdir)
    print(f"model {model}; {args.batch} prompts x n={args.n}, <= {args.response_length} response tokens, "
          f"{args.steps} steps, {args.reps} reps; runs in {args.workdir}")

    load_before = uptime()
    print(f"before: {load_before}", flush=True)
    results = []
    for rep in range(args.reps):
        order = paths if rep % 2 == 0 else paths[::-1]
        for path in order:
            results.append(run_once(path, rep, args, model, data, reward))
    load_after = uptime()
    summary = summarise(results)
    print_table(results, summary)
    print(f"\nload before: {load_before}\nload after:  {load_after}")
    for name in V1_PATHS:
        if name in summary and "legacy" in summary:
            v1, legacy = summary[name], summary["legacy"]
            print(f"{name} / legacy step time: {v1['ratio_step']:.2f}x "
                  f"({v1['median_later_s'] - legacy['median_later_s']:+.2f} s per step); "
                  f"CPU per step {fmt(v1['ratio_cpu_step'])}x; total wall time {v1['ratio_total']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({
            "model": model, "steps": args.steps, "reps": args.reps, "batch": args.batch, "n": args.n,
            "response_length": args.response_length, "ray_cpus": args.ray_cpus,
            "load_before": load_before, "load_after": load_after, "runs": results, "summary": summary,
        }, indent=2))
        print(f"raw numbers: {args.out}")
    failed = [r for r in results if r["returncode"] != 0 or len(r["steps"]) != args.steps]
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
