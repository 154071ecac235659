"""`manage.py dataset_stats NAME [--version N]`: print a version's data card."""
from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from apps.datasets.cli import DatasetCommand, get_version, histogram_lines, quantile_line
from apps.datasets.selectors import export_checksums, template_checks
from apps.datasets.services import exportability_pending, exportability_refusal

MAX_EXCLUDED_SHOWN = 50


class Command(DatasetCommand):
    help = "Print the data card of a dataset version (default: the newest): counts, distributions, " \
           "histograms (score, reward, the tasks' pass rates), length quantiles, exclusions, what each export " \
           "format would write, the diff against its parent and export checksums."


    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME")
        parser.add_argument("--version", dest="number", type=int, metavar="N")
        parser.add_argument("--json", action="store_true", help="the whole data card (and exports) as JSON")
        parser.add_argument("--all-excluded", action="store_true", help="list every excluded trajectory")

    def handle(self, *args: Any, **options: Any) -> None:
        version = get_version(options["name"], options["number"])
        card = version.data_card or {}
        exports = export_checksums(version)
        if options["json"]:
            self.stdout.write(json.dumps({**card, "status": version.status, "exports": exports,
                                          "template_checks": template_checks(version)}, indent=2,
                                         ensure_ascii=False, cls=DjangoJSONEncoder))
            return
        w = self.stdout.write
        published = f", published {version.published_at:%Y-%m-%d %H:%M}" if version.published_at else ""
        w(self.style.MIGRATE_HEADING(f"{version} — {version.status}{published}"))
        if version.parent_id:
            w(f"parent: v{version.parent.number}")
        w("counts: " + ", ".join(f"{k} {v}" for k, v in (version.counts or {}).items()))
        for key in ("by_scene", "by_model", "by_outcome"):
            w(f"{key.replace('_', ' ')}: " + (", ".join(f"{k or '-'} {v}" for k, v in (card.get(key) or {}).items())
                                              or "-"))
        w("score histogram (latest automatic review, 0-100):")
        for line in histogram_lines(card.get("score_histogram")):
            w(line)
        w("reward histogram:")
        for line in histogram_lines(card.get("reward_histogram")):
            w(line)
        rates = card.get("pass_rates")
        if rates:
            w(f"task pass rates over their rollouts ({len(rates.get('tasks') or {})} tasks: never solved "
              f"{rates['never']}, always solved {rates['always']}, in between {rates['between']}, "
              f"no rollout {rates['unknown']}):")
            for line in histogram_lines(rates.get("histogram")):
                w(line)
        w("lengths:")
        for key in ("turns", "text_tokens", "usage_tokens"):
            w(quantile_line(key, card.get(key)))
        dedup = card.get("dedup") or {}
        w(f"dedup: exact {'on' if dedup.get('exact') else 'off'} (removed {dedup.get('exact_removed', 0)}), "
          f"near {'on' if dedup.get('near') else 'off'} at {dedup.get('threshold')} "
          f"(removed {dedup.get('near_removed', 0)})")
        decontam = card.get("decontam")
        if decontam:
            w(f"decontam: {', '.join(decontam['test_sets'])}; {decontam['ngram']}-gram overlap >= "
              f"{decontam['ngram_threshold']}" + (f", MiniLM cosine >= {decontam['cosine_threshold']}"
                                                  if decontam.get("embedding") else "")
              + f" (removed {decontam.get('excluded', 0)}: "
              + (", ".join(f"{k} {v}" for k, v in (decontam.get("excluded_by_benchmark") or {}).items()) or "-")
              + ")")
        split = card.get("split") or {}
        w(f"split: by task, seed {split.get('seed')}, validation fraction {split.get('validation_fraction')}")
        reasons = card.get("excluded_reasons") or {}
        if reasons:
            w("excluded, by reason:")
            for reason, n in reasons.items():
                w(f"  {n:>6}  {reason}")
        excluded = card.get("excluded") or []
        limit = None if options["all_excluded"] else MAX_EXCLUDED_SHOWN
        for item in excluded[:limit]:
            w(f"  trajectory #{item['trajectory_id']} (task {item['task_id']}): {item['reason']}")
        if limit is not None and len(excluded) > limit:
            w(f"  ... and {len(excluded) - limit} more (--all-excluded)")
        diff = card.get("diff")
        if diff:
            w(f"against v{diff['parent']}: +{len(diff['added'])} added, -{len(diff['removed'])} removed, "
              f"{diff['kept']} kept")
            for item in (diff["added"] + diff["removed"])[:MAX_EXCLUDED_SHOWN]:
                sign = "+" if item in diff["added"] else "-"
                w(f"  {sign} trajectory #{item['trajectory_id']}: {item['reason']}")
        exportable = card.get("exportability")
        pending = exportability_pending(version)
        if pending is not None:
            w(exportability_refusal(pending, what="exporting and publishing",
                                    when_done="exports and publishing open when it is done"))
        if exportable:
            w("what each export format would write (lines all/train/validation, excluded):")
            for fmt, tally in exportable["formats"].items():
                lines = tally["lines"]
                reasons = "; ".join(f"{n} × {r}" for r, n in list(tally["reasons"].items())[:3])
                w(f"  {fmt:<20} {lines['all']:>6} {lines['train']:>6} {lines['validation']:>6}  excluded "
                  f"{tally['excluded']}" + (f": {reasons}" if reasons else ""))
            tool = (exportable.get("final_answer") or {}).get("tool") or {}
            if tool:
                w("  with final_answer tool (the finish call kept): "
                  + ", ".join(f"{fmt} {n}" for fmt, n in tool.items()))
            if exportable.get("not_applicable"):
                w("  not applicable: " + ", ".join(exportable["not_applicable"]))
        w("exporter versions: " + ", ".join(f"{k} {v}" for k, v in (version.exporter_versions or {}).items()))
        if exports:
            w("exports:")
            for e in exports:
                w(f"  {e['format']}/{e['split']}: {e['lines']} lines, {e['excluded']} excluded, {e['bytes']} bytes, "
                  f"sha256 {e['sha256']}  ({e['file']})")
        else:
            w("exports: none yet")
        checks = template_checks(version)
        if checks:
            w("chat templates checked:")
            for c in checks:
                w(f"  {c['template']} ({c['template_sha256'][:12]}) on export #{c['export']} {c['format']}: "
                  f"{c['passed']}/{c['records']} records pass; mask {c['mask']}")
                for e in c["render_errors"]:
                    w(f"    cannot render {e['records']} record(s): {e['error']}")
                for prop in c["properties"]:
                    w(f"    by design {prop['property']} ({prop['turns']} turn(s) in {prop['records']} record(s))")
