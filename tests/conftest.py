import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = ROOT / "instances"
DATA = Path(__file__).resolve().parent / "data"
PAPER = {"homogeneous": "amp_homogeneous", "het_cluster": "amp_het_cluster", "het_model": "amp_het_model"}
TRANSGAN_WORK_IDS = [0] + list(range(3, 15)) + list(range(41, 53))


@pytest.fixture(scope="session")
def paper_instances():
    from amp_opt import load_instance

    return {exp: load_instance(INSTANCES / f"{name}.json") for exp, name in PAPER.items()}


@pytest.fixture(scope="session")
def rankings():
    """AMP's predicted rankings, with transgan boundaries mapped to the 25 work layers."""
    data = json.loads((DATA / "predicted_rankings.json").read_text())
    for entry in data["het_model"]:
        entry["partition"] = [sum(1 for i in TRANSGAN_WORK_IDS if i < b) for b in entry["partition"]]
    return data


def instance_dict(name: str) -> dict:
    return json.loads((INSTANCES / f"{name}.json").read_text())


@pytest.fixture(scope="session")
def single_process(tmp_path_factory):
    """One run of ``test_runtime_run``'s model as a single process, its gradients dumped: the
    reference the runs of other layouts (uneven stages, several pipelines) must reproduce.
    (record, folder of its gradients)."""
    pytest.importorskip("torch")
    from amp_opt.runtime.run import run_plan
    from test_runtime_run import RUN, doc, plan

    folder = tmp_path_factory.mktemp("single")
    return run_plan(doc(devices=1), plan(), dump_grads=str(folder), **RUN), folder
