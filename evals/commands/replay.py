"""``semverify replay``: tau of model-free drafters on a greedy run's recorded outputs, without the target."""

from __future__ import annotations

import argparse
import json

from evals.replay import add_predicted_speedup, replay_run, replay_table
from semverify.commands import Command
from semverify.methods import load_methods
from semverify.sense import Datastore


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a greedy `semverify compare` run folder")
    p.add_argument("--methods", default="pld,rest", help="model-free methods, with parameters as in compare")
    p.add_argument("--source", default="vanilla", help="the method whose outputs are replayed")
    p.add_argument("--datastore", default=None, help="datastore file for rest (else context lookup only)")
    p.add_argument("--cost", default=None,
                   help="cost.json from `semverify forward-cost`: adds tau / forward cost, a speedup forecast")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    store = Datastore.load(args.datastore) if args.datastore else None
    results = replay_run(args.run_dir, load_methods(args.methods), store, args.source)
    if args.cost:
        add_predicted_speedup(results, args.cost)
    print(json.dumps(results, indent=2) if args.json else replay_table(results))
    return 0


COMMAND = Command("replay", "tau of model-free drafters (pld, rest) on a greedy run's recorded outputs, without the "
                  "target: compare datastores and drafter settings in seconds", configure, run)
