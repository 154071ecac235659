"""`manage.py dataset_compare NAME A B`: two versions side by side (counts, distributions, overlap)."""
from __future__ import annotations

import argparse
from typing import Any


from apps.datasets.cli import DatasetCommand, fmt_value, get_version, quantile_line
from apps.datasets.selectors import version_compare


class Command(DatasetCommand):
    help = "Compare two versions of a dataset: counts, distributions by scene/model/outcome, length " \
           "quantiles, member overlap and filter spec changes."


    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME")
        parser.add_argument("a", type=int, metavar="A", help="version number")
        parser.add_argument("b", type=int, metavar="B", help="version number")

    def handle(self, *args: Any, **options: Any) -> None:
        a = get_version(options["name"], options["a"])
        b = get_version(options["name"], options["b"])
        cmp = version_compare(a, b)
        w = self.stdout.write
        head_a, head_b = f"v{a.number}", f"v{b.number}"
        w(self.style.MIGRATE_HEADING(f"{a.dataset.name}: {head_a} ({a.status}) vs {head_b} ({b.status})"))
        w(f"{'':<24}{head_a:>10}{head_b:>10}{'change':>10}")
        for key, va, vb in cmp["counts"]:
            change = f"{(vb or 0) - (va or 0):+d}" if isinstance(va or 0, int) and isinstance(vb or 0, int) else ""
            w(f"{key:<24}{fmt_value(va):>10}{fmt_value(vb):>10}{change:>10}")
        for dist in cmp["distributions"]:
            w(f"by {dist['name']}:")
            for name, va, vb in dist["rows"]:
                w(f"  {name or '-':<22}{va:>10}{vb:>10}{vb - va:>+10d}")
        w("lengths:")
        for row in cmp["quantiles"]:
            w(quantile_line(f"{row['name']} {head_a}", row["a"]))
            w(quantile_line(f"{row['name']} {head_b}", row["b"]))
        o = cmp["overlap"]
        w(f"overlap: {o['both']} trajectories in both, {o['only_a']} only in {head_a}, {o['only_b']} only in "
          f"{head_b}; {o['same_content_hash']} of {head_a}'s members have a content hash present in {head_b}")
        if cmp["spec_changes"]:
            w("filter spec changes:")
            for key, va, vb in cmp["spec_changes"]:
                w(f"  {key}: {va!r} -> {vb!r}")
