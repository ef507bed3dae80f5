"""The quiet console (agentevolver.console): lines recorded from a real CPU run, kept or hidden; the stream
cuts lines at \\n and \\r, keeps partial lines, and logs everything."""

from __future__ import annotations

import io
import threading

import pytest

from agentevolver.console import QuietStream, is_noise

P = "\x1b[36m(TaskRunner pid=30082)\x1b[0m "
W = "\x1b[36m(WorkerDict pid=30486)\x1b[0m "

SHOWN = [
    f"{P}step    reward   success  resp len     turns   pg loss        kl      grad  rollout s  update s",
    f"{P} 1/2     0.250       25%        16       1.0   +0.0000    0.0000     1.714         20         1",
    f"{P}validation @ step 4: success 80.0%",
    "Training Progress:  50%|█████     | 1/2 [00:21<00:21, 21.99s/it]",
    f"{P}Total training steps: 2",
    f"{P}WARNING agentevolver.verl.step.trainer: something a user should see",
    "error: agent_flow.max_steps: must be >= 1",
    f"{P}Traceback (most recent call last):",
    f"{W}RuntimeError: the rollout server died",
]
HIDDEN = [
    "/x/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available: "
    "ModuleNotFoundError(\"No module named 'torchtitan'\")",
    "  warnings.warn(f\"torchtitan engine is not available: {e!r}\", stacklevel=1)",
    "2026-12-01 04:32:55,879\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled for "
    "this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.",
    f"{W}[rank0]:W1201 04:35:08.910000 30486 torch/fx/_symbolic_trace.py:56] is_fx_tracing will return true",
    f"{W}INFO:2026-12-01 04:35:09,846:[Rank 0] Saved model to /tmp/run/global_step_1/actor/model.pt",
    f"{P}local_global_step_folder: /tmp/run/global_step_1",
    "Loading weights: 100%|██████████| 20/20 [00:00<00:00, 18758.07it/s]",
    f"{W}LlamaForCausalLM contains 6.59M parameters",
    f"{W}",
    f"{P}/work/main/agentevolver/verl/step/trainer.py:88: FutureWarning: Warning: Class "
    "'verl.trainer.ppo.ray_trainer.RayPPOTrainer' is deprecated.",
    f"{P}test_gen_batch meta info: {{'eos_token_id': 2, 'pad_token_id': 0, 'validate': True, 'global_steps': 4}}",
    f"{P}validation generation end",
    f"{P}(\"Initial validation metrics: {{'val-aux/calc/reward/mean@1': np.float64(0.6), \"",
    f"{P} \"'val-core/calc/acc/mean@1': np.float64(0.6333333333333333), \"",
    f"{P} \"np.float64(0.8), 'val-aux/num_turns/min': np.int32(2), \"",
    f"{P} 'np.float64(2.0)}}')",
]


@pytest.mark.parametrize("line", SHOWN)
def test_lines_a_user_acts_on_are_shown(line: str) -> None:
    assert not is_noise(line)


@pytest.mark.parametrize("line", HIDDEN)
def test_known_noise_is_hidden(line: str) -> None:
    assert is_noise(line)


def test_stream_filters_whole_lines_and_logs_everything() -> None:
    shown, log = io.StringIO(), io.StringIO()
    stream = QuietStream(shown, log, threading.Lock())
    stream.write(f"{SHOWN[0]}\n{HIDDEN[0]}\nTraining Progress:  0%|")  # the bar's line is not finished yet
    assert shown.getvalue() == f"{SHOWN[0]}\n"
    stream.write(" 0/2\rTraining Progress: 50%| 1/2\n")
    assert shown.getvalue() == f"{SHOWN[0]}\nTraining Progress:  0%| 0/2\rTraining Progress: 50%| 1/2\n"
    assert HIDDEN[0] in log.getvalue() and SHOWN[0] in log.getvalue()
