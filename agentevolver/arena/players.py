"""The arena's players, by spec: scripted players, OpenAI-compatible endpoints, and checkpoints.

* ``scripted:<name>``: :class:`~agentevolver.module.agent_flow.game_players.ScriptedPlayer` (``random``,
  ``first``, ``pass``, or a bot the game offers such as tic-tac-toe's ``perfect``);
* ``endpoint:<base_url>#<model>``: any OpenAI-compatible endpoint (vLLM, a hosted model, a checkpoint served by
  ``python -m agentevolver.llm_server``);
* ``hf:<folder or built-in model name>``: a checkpoint loaded here with transformers (a training run's
  ``global_step_<N>/actor/huggingface`` folder, or ``smollm2-135m-instruct`` for the initial policy), answering
  from the seat's conversation through the model's chat template; greedy unless ``temperature`` > 0.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from typing import Any

from agentevolver.module.agent_flow.game_players import EndpointPlayer, ScriptedPlayer, TextSeat, Turn
from agentevolver.schema import ChatMessage

__all__ = ["HFPlayer", "PlayerSpec", "parse_spec"]

KINDS = ("scripted", "endpoint", "hf")


@dataclass(frozen=True)
class PlayerSpec:
    """A named player: ``kind`` and its ``target`` (a scripted name, an endpoint, a checkpoint)."""

    name: str
    kind: str
    target: str

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.target}"


def parse_spec(text: str) -> PlayerSpec:
    """``NAME=KIND:TARGET`` or ``KIND:TARGET`` (then the spec is the name); ValueError saying the form."""
    name, sep, spec = text.partition("=")
    if not sep:
        name, spec = text, text
    kind, _, target = spec.partition(":")
    if kind not in KINDS or not target or not name:
        raise ValueError(f"--player {text!r}: give NAME=KIND:TARGET with KIND one of {', '.join(KINDS)} "
                         "(scripted:perfect, endpoint:http://127.0.0.1:8010/v1#my-model, hf:path/to/checkpoint)")
    if kind == "endpoint" and "#" not in target:
        raise ValueError(f"--player {text!r}: an endpoint is endpoint:<base_url>#<model>")
    return PlayerSpec(name, kind, target)


class _Checkpoint:
    """One loaded checkpoint (model + tokenizer), shared by every seat it plays; generation is serialised."""

    def __init__(self, target: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentevolver.models import resolve_model_path

        path = resolve_model_path(target)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int, seed: int) -> str:
        import torch

        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with self.lock, torch.no_grad():
            torch.manual_seed(seed)
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                      pad_token_id=self.tokenizer.eos_token_id, **sampling)
        return self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


class HFPlayer(TextSeat):
    """A checkpoint playing a seat (module docstring)."""

    def __init__(self, checkpoint: _Checkpoint, label: str, opening: list[ChatMessage], *, temperature: float,
                 max_tokens: int, rng: random.Random) -> None:
        super().__init__(opening)
        self.checkpoint = checkpoint
        self.label = label
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.rng = rng

    async def reply(self, turn: Turn) -> str:
        messages = [message.model_dump(exclude_none=True) for message in self.messages]
        return await asyncio.to_thread(self.checkpoint.reply, messages, temperature=self.temperature,
                                       max_tokens=self.max_tokens, seed=self.rng.randrange(2**31))


class PlayerFactory:
    """Builds a seat's player from a spec; checkpoints and endpoint clients are loaded once per arena run."""

    def __init__(self, *, temperature: float, max_tokens: int, seed: int) -> None:
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._clients: dict[str, Any] = {}

    def __call__(self, spec: PlayerSpec, opening: list[ChatMessage]) -> TextSeat:
        if spec.kind == "scripted":
            player: TextSeat = ScriptedPlayer(spec.target, opening, self.rng)
        elif spec.kind == "endpoint":
            player = EndpointPlayer(self._client(spec), opening, temperature=self.temperature,
                                    max_tokens=self.max_tokens)
        else:
            if spec.target not in self._checkpoints:
                self._checkpoints[spec.target] = _Checkpoint(spec.target)
            player = HFPlayer(self._checkpoints[spec.target], spec.spec, opening, temperature=self.temperature,
                              max_tokens=self.max_tokens, rng=self.rng)
        return player

    def _client(self, spec: PlayerSpec) -> Any:
        if spec.target not in self._clients:
            from agentevolver.client.llm_client import LLMClient
            from agentevolver.client.llm_config import LLMEndpointConfig

            base_url, _, model = spec.target.partition("#")
            self._clients[spec.target] = LLMClient(LLMEndpointConfig(base_url=base_url, model=model, max_retries=1),
                                                   name=spec.name)
        return self._clients[spec.target]
