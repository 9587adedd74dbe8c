"""Load/save with the versioned schema; invalid files give TopologyError naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ringflow import config
from ringflow.errors import TopologyError
from ringflow.topology import Topology, build_cluster, load_topology


@pytest.mark.parametrize("ext", [".yaml", ".json"])
def test_round_trip_keeps_everything(tmp_path: Path, ext: str) -> None:
    t = build_cluster("dgx1-v100", 2, fabric="rail")
    t.meta["sim"] = {"alpha_us": 1.5}
    t.link("h0/gpu0", "h0/gpu3")["bw_GBps"] = 47.5           # a calibrated, one-direction figure
    path = str(tmp_path / f"c{ext}")
    t.save(path)
    u = Topology.load(path)
    assert u.to_dict() == t.to_dict()
    assert u.link("h0/gpu0", "h0/gpu3")["bw_GBps"] == 47.5 and u.link("h0/gpu3", "h0/gpu0")["bw_GBps"] == 50.0
    assert u.meta["sim"] == {"alpha_us": 1.5}
    assert u.path_class_smi("h1/gpu0", "h1/gpu4") == "NV2"
    assert load_topology(path).endpoints() == t.endpoints()


def _base() -> dict:
    return load_topology("pcie-8gpu").to_dict()


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(schema="other"), "schema"),
    (lambda d: d.update(version=7), "version"),
    (lambda d: d.update(nodes=[]), "nodes"),
    (lambda d: d.update(link=d.pop("links")), "unknown top-level key 'link'"),
    (lambda d: d["nodes"][2].pop("kind"), "nodes[2].kind is missing"),
    (lambda d: d["nodes"][1].update(kind="tpu"), "nodes[1].kind"),
    (lambda d: d["nodes"][1].update(host="zero"), "nodes[1].host"),
    (lambda d: d["nodes"][3].update(id=d["nodes"][4]["id"]), "used twice"),
    (lambda d: d["links"][3].update(bw_GBps=-5), "links[3].bw_GBps"),
    (lambda d: d["links"][0].update(bw_GBps="fast"), "links[0].bw_GBps"),
    (lambda d: d["links"][1].update(latency_us=-1), "links[1].latency_us"),
    (lambda d: d["links"][2].update(type="carrier-pigeon"), "links[2].type"),
    (lambda d: d["links"][4].update(b="nowhere"), "links[4].b"),
    (lambda d: d["links"][5].update(tier="tier9"), "links[5].tier"),
    (lambda d: d["links"][5].update(nlinks=0), "links[5].nlinks"),
    (lambda d: d["links"][6].pop("bw_GBps"), "links[6].bw_GBps is missing"),
])
def test_invalid_topologies_name_the_field(tmp_path: Path, mutate, needle: str) -> None:
    d = _base()
    mutate(d)
    with pytest.raises(TopologyError) as exc:
        Topology.from_dict(d)
    assert needle in str(exc.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(TopologyError) as exc2:
        load_topology(str(path))
    assert needle in str(exc2.value) and "bad.yaml" in str(exc2.value)


def test_unparseable_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="cannot parse"):
        load_topology(str(bad))
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(str(tmp_path / "none.yaml"))
    with pytest.raises(TopologyError, match="unknown topology preset"):
        load_topology("dgx-9000")
    with pytest.raises(TopologyError, match="extension"):
        load_topology("dgx-h100").save(str(tmp_path / "t.txt"))


def test_topo_file_knob_replaces_detection(tmp_path: Path) -> None:
    path = str(tmp_path / "mine.json")
    load_topology("dgx-a100").save(path)
    assert json.loads(Path(path).read_text())["schema"] == "ringflow.topology"
    with config.override(TOPO_FILE=path):
        t = load_topology("detect")
    assert t.name == "dgx-a100" and len(t.gpus()) == 8
