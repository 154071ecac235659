class ExpenseReports:
    """Employees' expense reports under a per-category policy limit."""

    CATEGORIES = ("meals", "travel", "lodging", "supplies")

    def __init__(self, employees=None, reports=None, limits=None, next_report=20):
        self.employees = dict(employees or {})
        self.reports = {rid: dict(r, items=list(r.get("items", []))) for rid, r in (reports or {}).items()}
        self.limits = dict(limits or {"meals": 60, "travel": 500, "lodging": 250, "supplies": 100})
        self.next_report = next_report

    def _report(self, report_id):
        if report_id not in self.reports:
            raise KeyError(f"no report {report_id}")
        return self.reports[report_id]

    @staticmethod
    def _total(report):
        return round(sum(item["amount"] for item in report["items"]), 2)

    def create_report(self, employee_id, title):
        if employee_id not in self.employees:
            raise KeyError(f"no employee {employee_id}")
        if not title.strip():
            raise ValueError("the title is empty")
        report_id = f"R-{self.next_report}"
        self.next_report += 1
        self.reports[report_id] = {"employee_id": employee_id, "title": title, "items": [], "status": "draft"}
        return {"report_id": report_id, "status": "draft"}

    def add_expense(self, report_id, category, amount, date, note=""):
        report = self._report(report_id)
        if report["status"] != "draft":
            raise ValueError(f"report {report_id} is {report['status']}, not a draft")
        if category not in self.CATEGORIES:
            raise ValueError(f"unknown category {category!r}")
        if amount <= 0:
            raise ValueError("the amount must be positive")
        if amount > self.limits[category]:
            raise ValueError(f"{amount} is over the {category} limit of {self.limits[category]}")
        report["items"].append({"category": category, "amount": amount, "date": date, "note": note})
        return {"report_id": report_id, "items": len(report["items"]), "total": self._total(report)}

    def get_report(self, report_id):
        report = self._report(report_id)
        return {"report_id": report_id, **report, "total": self._total(report)}

    def list_reports(self, employee_id, status="draft"):
        if employee_id not in self.employees:
            raise KeyError(f"no employee {employee_id}")
        return [{"report_id": rid, "title": r["title"], "status": r["status"], "total": self._total(r)}
                for rid, r in sorted(self.reports.items()) if r["employee_id"] == employee_id and r["status"] == status]

    def submit_report(self, report_id):
        report = self._report(report_id)
        if not report["items"]:
            raise ValueError(f"report {report_id} has no expenses")
        if report["status"] != "draft":
            raise ValueError(f"report {report_id} is already {report['status']}")
        report["status"] = "submitted"
        return {"report_id": report_id, "status": "submitted", "total": self._total(report)}
