"""Families of structured data work: csv sums and joins, json fields."""

from __future__ import annotations

import json
import random
from collections import defaultdict

from dockyard.envs.terminal_families.core import NAMES, WORDS, Family, TaskInstance, distinct, file_name


class CsvSum(Family):
    name, category = "csv_sum", "data-processing"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        columns = ["id", "name", "team", rng.choice(("amount", "score", "points", "hours"))]
        value = columns[3]
        teams = distinct(rng, 3)
        rows = [(i + 1, rng.choice(NAMES), rng.choice(teams), rng.randint(1, 500)) for i in range(rng.randint(5, 25))]
        source, out = file_name(rng, ".csv"), file_name(rng, "_total.txt")
        files = {source: ",".join(columns) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)}
        if level == 1:
            total = sum(r[3] for r in rows)
            return self.task(level, f"{source} is a csv file with a header row. Write the sum of its {value} column "
                             f"(digits only) to {out}.", files,
                             f"awk -F, 'NR>1{{s+=$4}} END{{print s}}' {source} > {out}",
                             f"def test_sum():\n    assert (APP / {out!r}).read_text().strip() == {str(total)!r}")
        if level == 2:
            team = rng.choice([r[2] for r in rows])
            total = sum(r[3] for r in rows if r[2] == team)
            return self.task(level, f"{source} is a csv file with a header row. Write the sum of the {value} column "
                             f"over the rows whose team is {team} (digits only) to {out}.", files,
                             f"awk -F, -v t={team} 'NR>1 && $3==t{{s+=$4}} END{{print s}}' {source} > {out}",
                             f"def test_sum():\n    assert (APP / {out!r}).read_text().strip() == {str(total)!r}")
        out = file_name(rng, "_by_team.csv")
        sums: dict[str, int] = defaultdict(int)
        for r in rows:
            sums[r[2]] += r[3]
        expected = ["team,total"] + [f"{t},{sums[t]}" for t in sorted(sums)]
        return self.task(level, f"{source} is a csv file with a header row. Write a csv file {out} with the header "
                         f"team,total and one row per team with the sum of its {value} column, sorted by team name.",
                         files, f"{{ echo team,total; awk -F, 'NR>1{{s[$3]+=$4}} END{{for (t in s) print t\",\"s[t]}}' "
                         f"{source} | LC_ALL=C sort; }} > {out}",
                         f"def test_by_team():\n    assert (APP / {out!r}).read_text().strip().split('\\n') == {expected!r}")


class CsvJoin(Family):
    name, category = "csv_join", "data-processing"
    levels = (1, 2)

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        ids = rng.sample(range(100, 999), rng.randint(4, 10))
        people = {i: rng.choice(NAMES) for i in ids}
        billed = ids if level == 1 else rng.sample(ids, max(2, len(ids) - 2)) + [rng.randint(1000, 1999)]
        amounts = {i: rng.randint(1, 900) for i in billed}
        left, right, out = "people.csv", "amounts.csv", file_name(rng, "_joined.csv")
        files = {left: "id,name\n" + "".join(f"{i},{people[i]}\n" for i in rng.sample(ids, len(ids))),
                 right: "id,amount\n" + "".join(f"{i},{amounts[i]}\n" for i in rng.sample(billed, len(billed)))}
        both = sorted(set(people) & set(amounts))
        expected = ["id,name,amount"] + [f"{i},{people[i]},{amounts[i]}" for i in both]
        what = "" if level == 1 else " Only ids found in both files are written."
        return self.task(level, f"Join {left} and {right} on their id column into {out}: the header id,name,amount "
                         f"and one row per id, sorted by id (numerically).{what}", files,
                         f"{{ echo id,name,amount; join -t, <(tail -n +2 {left} | sort -t, -k1,1) "
                         f"<(tail -n +2 {right} | sort -t, -k1,1) | sort -t, -k1,1n; }} > {out}",
                         f"def test_joined():\n    assert (APP / {out!r}).read_text().strip().split('\\n') == {expected!r}")


class JsonField(Family):
    name, category = "json_field", "data-processing"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        source = file_name(rng, ".json")
        if level == 1:
            record = {"name": rng.choice(WORDS), "version": f"{rng.randint(0, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
                      "owner": rng.choice(NAMES), "port": rng.randint(1024, 9999)}
            key, out = rng.choice(list(record)), file_name(rng, "_value.txt")
            return self.task(level, f"Write the value of the field {key} of the json object in {source} (the value "
                             f"alone, no quotes) to {out}.", {source: json.dumps(record, indent=2) + "\n"},
                             f"python3 -c 'import json; print(json.load(open(\"{source}\"))[\"{key}\"])' > {out}",
                             f"def test_value():\n    assert (APP / {out!r}).read_text().strip() == {str(record[key])!r}")
        if level == 2:
            items = [{"name": name, "active": rng.random() < 0.5, "size": rng.randint(1, 99)}
                     for name in distinct(rng, rng.randint(4, 9))]
            items[0]["active"] = True
            out = file_name(rng, "_active.txt")
            expected = [item["name"] for item in items if item["active"]]
            return self.task(level, f"{source} holds a json list of objects. Write the name of every object whose "
                             f"active field is true, one per line, in the list's order, to {out}.",
                             {source: json.dumps(items, indent=2) + "\n"},
                             f"python3 -c 'import json; [print(i[\"name\"]) for i in json.load(open(\"{source}\")) "
                             f"if i[\"active\"]]' > {out}",
                             f"def test_names():\n    assert (APP / {out!r}).read_text().split() == {expected!r}")
        config = {"service": rng.choice(WORDS), "replicas": rng.randint(1, 5), "version": f"1.{rng.randint(0, 9)}",
                  "owner": rng.choice(NAMES)}
        key = rng.choice(("replicas", "owner"))
        value = rng.randint(6, 20) if key == "replicas" else rng.choice([n for n in NAMES if n != config["owner"]])
        expected = dict(config, **{key: value})
        literal = json.dumps(value)
        return self.task(level, f"Set the field {key} of the json object in {source} to {literal} and write the "
                         f"object back to {source} (keep the other fields as they are).",
                         {source: json.dumps(config, indent=2) + "\n"},
                         f"python3 -c 'import json; d=json.load(open(\"{source}\")); d[\"{key}\"]={literal}; "
                         f"json.dump(d, open(\"{source}\", \"w\"), indent=2)'",
                         f"import json\n\n\ndef test_rewritten():\n    assert json.loads((APP / {source!r}).read_text()) == "
                         f"{expected!r}")
