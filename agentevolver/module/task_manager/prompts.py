"""Every text the task manager's LLM roles are shown: explorer, summariser, feasibility judge, grader.

Kept in one module so the wording can be reviewed (and versioned: :data:`PROMPT_VERSION` enters the
generation checkpoint's digest, so changing a prompt starts generation afresh) in one place. The replies
asked for are JSON, because they are parsed and schema-validated (``parsing.py``), and the same schema is
sent as ``response_format`` where the endpoint takes it.
"""

from __future__ import annotations

#: Bump when a prompt below changes in a way that changes what generation produces.
PROMPT_VERSION = 4

#: What replaces the seed task's real query before the summariser sees a trajectory (seed 000, ch. 2).
MASK = "[MASKED]"

EXPLORER_INSTRUCTIONS = """\
You are now EXPLORING this environment to discover what can be done in it; you are not asked to solve the \
task shown to you (use it only as context). For up to {max_steps} steps, take one action per message in \
the environment's format described above, look at what comes back, and keep varying what you try, so \
that the record of this exploration shows many different, concrete things a user could ask for. Begin \
with these operations: {focus}. {opening} Avoid ending the episode (submitting or giving a final answer) \
while there is still something new to try.

{profile}
{tools}"""

#: How an exploration opens, one drawn per exploration (``task_manager.explore_seed``, seed task, round), with
#: ``{numbers}`` a fresh draw of numbers: explorations of one seed start differently even from the same model.
EXPLORER_OPENINGS = (
    "Start with the simplest thing it can do, using {numbers}.",
    "Start with something a user would ask on a busy day, using {numbers}.",
    "Start by combining two of its abilities, feeding one result into the next, with {numbers}.",
    "Start with unusual but valid inputs, such as {numbers}.",
    "Start with an everyday situation (shopping, travel, cooking) that involves {numbers}.",
    "Start by checking one result a second way, with {numbers}.",
)

EXPLORER_TOOLS = """
Tools of the environment (OpenAI function format):
{schemas}"""

#: Added to the explorer's instructions in a multi-seat environment (a game), at every step, naming the seat to
#: move: the explorer plays every seat in turn, each in the view that seat has (its opening, what it saw).
EXPLORER_SEAT = """

This environment has several seats that take turns ({seats}); you play every one of them in turn. It is now \
seat {seat}'s turn: act as {seat}. The conversation is what {seat} has seen so far; reply with {seat}'s \
next action only."""

SUMMARIZER_SYSTEM = "You turn records of an agent exploring an environment into training tasks for that agent."

SUMMARIZER_USER = """\
{profile}

Below is the record of an exploration of this environment. The task the agent was originally given is \
hidden and shown as {mask}; do not guess it.

<record>
{transcript}
</record>

Write up to {k} different tasks a user could ask an agent in this environment, each one something the \
actions in the record show to be possible. Each task must be self-contained: state every value it needs, \
and do not mention the record, the exploration or {mask}. For each task give the expected answer (or the \
observable result that shows success) and your confidence, from 0 to 1, that the task can be done as stated.

Reply with JSON only, for example:
{{"tasks": [{{"query": "...", "answer": "...", "confidence": 0.8}}]}}"""

#: The summariser's request when the profile declares that observations prove answers (``answers``): each
#: task carries the answer the environment returned and where; code then checks the proof (``proof.py``).
SUMMARIZER_USER_GROUNDED = """\
{profile}

Below is the record of an exploration of this environment. The task the agent was originally given is \
hidden and shown as {mask}; do not guess it.

<record>
{transcript}
</record>

The environment returned these results in the record:
{results}

Write up to {k} different questions whose answer is one of these results. For each one give:
- "query": a self-contained question that states every value the environment was given to produce the \
answer, without mentioning the record, the exploration or {mask};
- "answer": the value the environment returned, exactly as it appears in the record, and nothing else;
- "evidence": the line of the record where the environment returned it.

Reply with JSON only: {{"tasks": [{{"query": "...", "answer": "...", "evidence": "..."}}]}}"""

FILTER_SYSTEM = "You check whether a task can be carried out in a given environment."

FILTER_USER = """\
{profile}

Task: {query}
Expected answer or result: {answer}

Can an agent complete this task using only this environment's operations and the information the task \
gives? Reply with a JSON object only: {{"feasible": true or false, "reason": "<one sentence>"}}"""

GRADER_SYSTEM = "You grade an agent's attempt at a task from the record of its episode."

GRADER_USER = """\
Task: {query}
{reference}
<record>
{transcript}
</record>

Judge the agent's attempt on three points:
- relevance: did the agent work on this task rather than on something else?
- success: did it complete the task{success_hint}?
- efficiency: did it get there without needless, repeated or failed steps?
{reply_format}"""

GRADER_REFERENCE = "Reference answer: {answer}\n"

GRADER_BINARY = ('Reply with a JSON object only: {"relevant": true or false, "success": true or false, '
                 '"efficient": true or false, "reason": "<one sentence>"}')

GRADER_GRADED = ('Reply with a JSON object only, each score a number from 0 (not at all) to 1 (fully): '
                 '{"relevance": 0.0, "success": 0.0, "efficiency": 0.0, "reason": "<one sentence>"}')

# ------------------------------------------------------------------------------------------------------------
# Worked examples (``task_manager.demonstrations``): one for the summariser, one per verdict for the feasibility
# judge, shown as earlier exchanges. They are about a made-up notes app, so it shows the *format* without suggesting tasks for the real environment; a task
# copying its text is rejected (``DEMO_TEXTS``). Small models (SmolLM2-135M) answer in prose or code
# without it and in the asked JSON with it.
DEMO_PROFILE = """Environment `notes`: a notebook app whose notes can be created and searched.

Entities:
- note: a text note with a title
  attributes: title (the note's name); text (its content)
  operations: create (add a note); search (find notes containing a word)"""

DEMO_TRANSCRIPT = """[environment (system)]
You manage notes. Call create(title, text) or search(word).

[environment]
[MASKED]

[agent]
create(title="groceries", text="milk, eggs")

[environment]
note 7 created

[agent]
search(word="milk")

[environment]
found: note 7 (groceries)"""

DEMO_TASKS = [
    {"query": "Create a note titled 'groceries' that says 'milk, eggs'.",
     "answer": "a note 'groceries' with the text 'milk, eggs' exists", "confidence": 0.9},
    {"query": "Find the note that mentions milk and tell me its title.", "answer": "groceries", "confidence": 0.8},
]

#: Texts of the example a summariser reply must not copy as a task (its queries and answers).
DEMO_TEXTS = tuple(text for task in DEMO_TASKS for text in (task["query"], task["answer"]))

#: The worked example of the grounded request: a made-up library catalogue whose tool returns numbers.
DEMO_GROUNDED_PROFILE = """Environment `library`: a catalogue that counts books.

Entities:
- author: a writer whose books the library holds
  attributes: name (the author's name)
  operations: count_books (how many books by an author the library holds)"""

DEMO_GROUNDED_TRANSCRIPT = """[environment (system)]
You answer questions about the library. Call count_books(author).

[environment]
[MASKED]

[agent]
count_books(author="Jane Austen")

[environment (tool result)]
12"""

DEMO_GROUNDED_RESULTS = '- 12 (from count_books({"author": "Jane Austen"}))'

DEMO_GROUNDED_TASKS = {"tasks": [
    {"query": "How many books by Jane Austen does the library hold?", "answer": "12", "evidence": "12"},
]}

#: Texts of the grounded example a reply must not copy as a task.
DEMO_GROUNDED_TEXTS = tuple(task["query"] for task in DEMO_GROUNDED_TASKS["tasks"])

#: (task, expected answer, verdict) exchanges shown to the feasibility judge: one of each verdict, so the
#: example does not bias the judge towards either.
DEMO_FILTER = (
    ("Find the note that mentions milk and tell me its title.", "groceries",
     '{"feasible": true, "reason": "search finds notes by word and shows their titles"}'),
    ("Email the groceries note to alice@example.com.", "the email is sent",
     '{"feasible": false, "reason": "the notes app has no operation that sends email"}'),
)

RETRY_FEEDBACK = "Your reply could not be used: {error}. Reply again with only the JSON described above."
