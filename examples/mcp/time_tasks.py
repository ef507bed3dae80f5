"""Write timezone-conversion tasks for the time server (``mcp-server-time``), with answers computed here.

    python examples/mcp/time_tasks.py > tasks.jsonl            # then `tasks: tasks.jsonl` in servers.yaml

Each task asks for the date and time in one city when a clock shows a time in another (``convert_time`` answers it,
as the target's ``datetime``); the answer, ``YYYY-MM-DDTHH:MM``, is computed with the standard library's zoneinfo
for today's date, so it matches what the server says today (daylight saving time included; regenerate the file
on another day). A final answer passes when it contains it (the tool's ``datetime`` copied whole does). 48 tasks:
32 train, 16 val.
"""

import itertools
import json
import random
from datetime import date, datetime
from zoneinfo import ZoneInfo

ZONES = ["Europe/London", "Europe/Paris", "Asia/Tokyo", "America/New_York", "Australia/Sydney", "Asia/Kolkata",
         "America/Los_Angeles", "Africa/Cairo"]


def converted(clock: str, source: str, target: str) -> str:
    hour, minute = map(int, clock.split(":"))
    moment = datetime.combine(date.today(), datetime.min.time()).replace(hour=hour, minute=minute,
                                                                          tzinfo=ZoneInfo(source))
    return moment.astimezone(ZoneInfo(target)).strftime("%Y-%m-%dT%H:%M")


def main() -> None:
    rng = random.Random(0)
    pairs = list(itertools.permutations(ZONES, 2))
    rng.shuffle(pairs)
    for index, (source, target) in enumerate(pairs[:48]):
        clock = f"{rng.randrange(24):02d}:{rng.choice([0, 15, 30, 45]):02d}"
        task = {"id": f"convert-{index:02d}", "split": "train" if index < 32 else "val",
                "query": f"It is {clock} in {source}. What are the date and time in {target} then?",
                "answer": converted(clock, source, target)}
        print(json.dumps(task))


if __name__ == "__main__":
    main()
