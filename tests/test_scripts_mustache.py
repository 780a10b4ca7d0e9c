"""Submit-script templates rendered by compiled functions (psij._scripts.mustache) give
exactly what pystache gives: every shipped template with the contexts of every batch executor,
and small templates for each Mustache rule, including the values only pystache renders."""

from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import pystache  # type: ignore[import-untyped]
import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    ResourceSpecV1,
)
from psij._data import data_dir
from psij._scripts.generator import TemplatedScriptGenerator, inline_partials
from psij._scripts.mustache import NeedsPystache, compile_template
from psij._scripts.quoting import ShellWord, bash_escape
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from psij.staging import StageIn

BATCH = ["slurm", "sge", "pbs", "pbs_classic", "lsf", "cobalt", "flux", "nqsv", "batch-test"]


def by_pystache(template: str, context: Dict[str, Any]) -> str:
    renderer = pystache.Renderer(escape=bash_escape, missing_tags="ignore")
    text: str = renderer.render(pystache.parse(template), context)
    return text


def compiled(template: str, context: Dict[str, Any]) -> str:
    render = compile_template(pystache.parse(template), bash_escape)
    assert render is not None
    return render(context)


def jobs(tmp_path: Path) -> List[Job]:
    full = JobSpec(
        "/opt/my app/run $(x).sh", ["a b", "it's", "`id`", "new\nline", ""],
        directory=str(tmp_path / "d i r"), name="name 'q' $(x)", inherit_environment=False,
        environment={"PLAIN": "v", "HOSTILE": "$(id) \"q\" \\ $HOME", "NUM": "7"},
        stdin_path="/in put", stdout_path="/out's", stderr_path="/e`rr`",
        resources=ResourceSpecV1(node_count=2, processes_per_node=3, cpu_cores_per_process=2,
                                 gpu_cores_per_process=1, exclusive_node_use=True,
                                 memory=3 * 1024**3 + 1),
        attributes=JobAttributes(duration=timedelta(days=1, seconds=61), queue_name="debug",
                                 account="proj-42", reservation_id="resv.1",
                                 custom_attributes={"slurm.flag": True, "slurm.off": False,
                                                    "slurm.constraint": "a&b", "sge.l": "x=1",
                                                    "pbs.l": "y=2", "lsf.q": "z",
                                                    "other.ignored": "x"}),
        pre_launch="/pre.sh", post_launch="post.sh", launcher="multiple",
        stage_in={StageIn(str(tmp_path / "in.txt"), "in.txt")})
    return [Job(full), Job(JobSpec("/bin/true")),
            Job(JobSpec("/bin/echo", ["x"], attributes=JobAttributes(duration=timedelta(0))))]


@pytest.mark.parametrize("name", BATCH)
def test_every_executor_script_is_the_same_as_pystache_renders_it(name: str,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("x")
    ex = JobExecutor.get_instance(name, config=JobExecutorConfig(work_directory=tmp_path / "w"))
    assert isinstance(ex, BatchSchedulerExecutor)
    generator = ex.generator
    assert isinstance(generator, TemplatedScriptGenerator)
    try:
        rendered = 0
        for job in jobs(tmp_path):
            assert job.spec is not None
            try:
                ex._check_script_values(job, job.spec)
                context = ex._create_script_context(job)
            except InvalidJobException:
                assert name == "flux"  # it refuses memory amounts
                continue
            rendered += 1
            expected = generator.renderer.render(generator.template, context)
            assert generator.render(context) == expected
            assert ex.submit_script(job) == expected
        assert rendered >= 2
    finally:
        ex.close()


def test_pilot_task_template_is_the_same_as_pystache_renders_it() -> None:
    folder = data_dir("templates")
    text = inline_partials((folder / "pilot_task.mustache").read_text(), [folder])
    assert compile_template(pystache.parse((folder / "pilot_task.mustache").read_text()),
                            bash_escape) is None  # partials are left to pystache
    for context in ({}, {"staging": {"in": [{"source": "a b", "target": "$x"}], "out": []}}):
        assert compiled(text, context) == by_pystache(text, context)


class Holder:
    plain = "attr"
    number = 7

    def method(self) -> str:
        return "called"

    @property
    def items(self) -> List[Dict[str, str]]:
        return [{"k": "1"}, {"k": "2"}]


RULES = [
    ("{{a}}|{{{a}}}|{{&a}}", {"a": "x \"y\" $z"}),
    ("{{missing}}[{{a.missing}}][{{a.b.c}}]", {"a": {"b": {"c": 5}}}),
    ("{{#list}}<{{.}}>{{/list}}{{^list}}none{{/list}}", {"list": [1, "two", 0, None]}),
    ("{{#list}}<{{.}}>{{/list}}{{^list}}none{{/list}}", {"list": []}),
    ("{{#d}}{{k}}/{{outer}}{{/d}}", {"d": {"k": "inner"}, "outer": "o"}),
    ("{{#flag}}yes{{/flag}}{{^flag}}no{{/flag}}", {"flag": False}),
    ("{{#flag}}yes {{.}}{{/flag}}", {"flag": True}),
    ("{{#n}}n={{.}}{{/n}}{{#z}}z{{/z}}", {"n": 3, "z": 0}),
    ("{{#s}}[{{.}}]{{/s}}", {"s": "a string is one item"}),
    ("{{#o}}{{plain}} {{number}} {{method}}{{#items}}({{k}}){{/items}}{{/o}}", {"o": Holder()}),
    ("{{o.plain}} {{o.method}} {{o.nothing}} {{i.real}}", {"o": Holder(), "i": 5}),
    ("{{#words}}{{.}} {{/words}}", {"words": [ShellWord("a b"), ShellWord("$x"), "plain's"]}),
    ("{{#gen}}{{.}}{{/gen}}", {"gen": (str(i) for i in range(3))}),
    ("{{! comment }}{{=<% %>=}}<% a %><%={{ }}=%>{{a}}", {"a": "v"}),
    ("  {{#a}}\n  line {{.}}\n  {{/a}}\nend\n", {"a": ["1", "2"]}),
    ("{{#a}}{{#a}}{{.}}{{/a}}{{/a}}", {"a": [[1, 2], [3]]}),
    ("{{.}}", {}),
    ("{{#a}}{{b.c}}{{/a}}", {"a": [{"b": {"c": "in"}}, {}], "b": {"c": "out"}}),
    ("{{#d}}{{k}}[{{missing}}]{{/d}}", {"d": defaultdict(lambda: "made", {"k": "v"})}),
]


@pytest.mark.parametrize("template,context", RULES)
def test_each_mustache_rule_renders_as_pystache(template: str, context: Dict[str, Any]) -> None:
    if "gen" in context:  # a generator is used up by one render
        expected = by_pystache(template, {"gen": (str(i) for i in range(3))})
    else:
        expected = by_pystache(template, context)
    assert compiled(template, context) == expected


@pytest.mark.parametrize("template,context", [
    ("{{f}}|{{x}}\n", {"f": lambda: "from a lambda {{x}}", "x": "X"}),
    ("{{f}}|{{#f}}<{{.}}>{{/f}}\n", {"f": b"bytes"}),
    ("{{#f}}<{{x}}>{{/f}}\n", {"f": [lambda text: text.upper()], "x": "X"}),
    ("{{#f}}<{{x}}>{{/f}}\n", {"f": lambda text: text + text, "x": "X"}),
])
def test_values_only_pystache_renders_go_through_pystache(template: str,
                                                         context: Dict[str, Any],
                                                         tmp_path: Path) -> None:
    with pytest.raises(NeedsPystache):
        compiled(template, context)
    path = tmp_path / "t.mustache"
    path.write_text(template)
    generator = TemplatedScriptGenerator(JobExecutorConfig(), path)
    assert generator.render(context) == by_pystache(template, context)


def test_a_replaced_renderer_is_used(tmp_path: Path) -> None:
    path = tmp_path / "t.mustache"
    path.write_text("{{a}}\n")
    generator = TemplatedScriptGenerator(JobExecutorConfig(), path)
    assert generator.render({"a": "$x"}) == "\\$x\n"
    generator.renderer = pystache.Renderer(escape=lambda s: f"<{s}>", missing_tags="ignore")
    assert generator.render({"a": "$x"}) == "<$x>\n"
