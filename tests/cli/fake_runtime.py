"""A fake container runtime (podman/docker) that runs an image's command on this host."""

from __future__ import annotations

FAKE_RUNTIME = r'''#!/usr/bin/env python3
import json, os, signal, subprocess, sys, time
state = os.environ["FAKE_RUNTIME_STATE"]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
verb, rest = sys.argv[1], sys.argv[2:]
if verb == "info":
    print("host: stand-in runtime")
    sys.exit(0)
if verb == "run":
    env, name, i = {}, None, 0
    flags_with_value = {"--name", "--env", "--volume", "--publish", "--workdir", "--device"}
    while rest[i].startswith("-"):
        flag, value = (rest[i].split("=", 1) + [None])[:2]
        if flag in flags_with_value and value is None:
            value, i = rest[i + 1], i + 1
        if flag == "--name":
            name = value
        if flag == "--env":
            k, _, v = value.partition("=")
            env[k] = v
        i += 1
    image, args = rest[i], rest[i + 1:]
    with open(os.path.join(state, name + ".env"), "w") as f:
        json.dump(env, f)
    with open(os.path.join(state, name + ".pid"), "w") as f:
        f.write(str(os.getpid()))
    print("entrypoint of", image, "args", args, flush=True)
    print("NVIDIA_VISIBLE_DEVICES=" + env.get("NVIDIA_VISIBLE_DEVICES", ""), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (print("container got SIGTERM", flush=True), sys.exit(0)))
    while True:
        time.sleep(0.1)
if verb == "exec":
    while rest[0].startswith("-"):
        rest = rest[1:]
    name, command = rest[0], rest[1:]
    env = json.load(open(os.path.join(state, name + ".env")))
    sys.exit(subprocess.call(command, env={"PATH": os.environ["PATH"], **env}))
if verb == "stop":
    name = rest[-1]
    try:
        os.kill(int(open(os.path.join(state, name + ".pid")).read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    print(name)
    sys.exit(0)
sys.exit(125)
'''
