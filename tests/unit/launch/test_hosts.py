import pytest

from launch.hosts import HostsFileError, parse_hosts_file

GOOD = """\
# a three-host run
head  10.99.0.11  coordinator router logger trainer ps:1   # the launcher's host
h2    10.99.0.12  rollout:2 ps:1 python=/opt/venv/bin/python
h3                rollout:1 ssh="ssh -p 2222"
"""


def resolver(name: str) -> str:
    table = {"h3": "10.99.0.13"}
    if name not in table:
        raise OSError(name)
    return table[name]


def parse(tmp_path, text: str):
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return parse_hosts_file(path, resolve=resolver)


def test_parses_roles_counts_options_and_comments(tmp_path) -> None:
    hosts = parse(tmp_path, GOOD)
    assert [h.name for h in hosts.hosts] == ["head", "h2", "h3"]
    assert hosts.count("rollout") == 3 and hosts.count("ps") == 2 and hosts.count("trainer") == 1
    assert [h.name for h in hosts.placement("rollout")] == ["h2", "h2", "h3"]
    h2, h3 = hosts.hosts[1], hosts.hosts[2]
    assert h2.python == "/opt/venv/bin/python"
    assert h3.address == "10.99.0.13" and h3.ssh == ("ssh", "-p", "2222")
    assert hosts.spans_hosts


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (GOOD + "h4 rollout\n", 5, "unknown host 'h4'"),
        (GOOD + "h5 10.99.0.15 router\n", 5, "duplicate role 'router' (already on line 2)"),
        (GOOD + "h2 10.99.0.16 rollout\n", 5, "host 'h2' already defined on line 3"),
        (GOOD + "h6 10.99.0.16 rollout:x\n", 5, "count of 'rollout' must be a positive integer"),
        (GOOD + "h6 10.99.0.16 gpu:2\n", 5, "unknown role 'gpu'"),
        (GOOD + "h6 10.99.0.16 rollout colour=red\n", 5, "unknown option 'colour'"),
        (GOOD + 'h6 10.99.0.16 rollout ssh="unterminated\n', 5, "malformed line"),
        (GOOD + "h6 10.99.0.16\n", 5, "takes no role"),
        (GOOD + "h6 10.99.0.16 router:2\n", 5, "takes no count"),
        ("head 10.0.0.1 coordinator router trainer ps\n", 1, "no host takes the 'rollout' role"),
    ],
)
def test_bad_files_are_refused_with_the_line_number(tmp_path, text: str, line: int, needle: str) -> None:
    with pytest.raises(HostsFileError) as info:
        parse(tmp_path, text)
    assert info.value.line_no == line
    assert f"hosts.txt:{line}:" in str(info.value) and needle in str(info.value)
