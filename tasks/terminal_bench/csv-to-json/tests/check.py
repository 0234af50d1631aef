import json

checks = []
try:
    people = json.load(open("/app/people.json"))
except (OSError, ValueError):
    people = None
checks.append(isinstance(people, list))
checks.append(isinstance(people, list) and [p.get("name") for p in people if isinstance(p, dict)] == ["Ada", "Alan", "Grace"])
checks.append(isinstance(people, list) and [p.get("age") for p in people if isinstance(p, dict)] == [36, 41, 85])
print(json.dumps({"reward": sum(map(bool, checks)) / len(checks)}))
