import datetime


class LibraryLoans:
    """A lending library: books with copies, members, loans, holds and fines."""

    LOAN_DAYS = 14
    MAX_RENEWALS = 2

    def __init__(self, books=None, members=None, loans=None, holds=None, today="2026-12-01", next_id=100):
        self.books = dict(books or {})
        self.members = dict(members or {})
        self.loans = dict(loans or {})
        self.holds = list(holds or [])
        self.today = today
        self.next_id = next_id

    def _due(self, start):
        return (datetime.date.fromisoformat(start) + datetime.timedelta(days=self.LOAN_DAYS)).isoformat()

    def _on_loan(self, isbn):
        return sum(1 for loan in self.loans.values() if loan["isbn"] == isbn and loan["returned"] is None)

    def search_books(self, query):
        q = query.lower()
        return [{"isbn": isbn, "title": b["title"], "author": b["author"],
                 "available": b["copies"] - self._on_loan(isbn)}
                for isbn, b in sorted(self.books.items())
                if q in b["title"].lower() or q in b["author"].lower()]

    def checkout_book(self, member_id, isbn):
        member = self.members.get(member_id)
        if member is None:
            raise KeyError(f"unknown member {member_id}")
        if member["fines"] > 0:
            raise ValueError(f"member {member_id} owes {member['fines']:.2f} in fines")
        if isbn not in self.books:
            raise KeyError(f"unknown ISBN {isbn}")
        if self.books[isbn]["copies"] - self._on_loan(isbn) <= 0:
            raise ValueError(f"no copy of {isbn} is available; place a hold instead")
        loan_id = f"L{self.next_id}"
        self.next_id += 1
        self.loans[loan_id] = {"member_id": member_id, "isbn": isbn, "due": self._due(self.today),
                               "renewals": 0, "returned": None}
        return {"loan_id": loan_id, "due": self.loans[loan_id]["due"]}

    def return_book(self, loan_id):
        loan = self.loans.get(loan_id)
        if loan is None or loan["returned"] is not None:
            raise ValueError(f"no open loan {loan_id}")
        loan["returned"] = self.today
        return {"loan_id": loan_id, "returned": self.today}

    def renew_loan(self, loan_id):
        loan = self.loans.get(loan_id)
        if loan is None or loan["returned"] is not None:
            raise ValueError(f"no open loan {loan_id}")
        if loan["renewals"] >= self.MAX_RENEWALS:
            raise ValueError("renewal limit reached")
        loan["due"] = self._due(loan["due"])
        loan["renewals"] += 1
        return {"loan_id": loan_id, "due": loan["due"]}

    def place_hold(self, member_id, isbn):
        if member_id not in self.members or isbn not in self.books:
            raise KeyError("unknown member or ISBN")
        self.holds.append({"member_id": member_id, "isbn": isbn})
        return {"member_id": member_id, "isbn": isbn, "position": len(self.holds)}

    def list_loans(self, member_id):
        return [{"loan_id": lid, **loan} for lid, loan in sorted(self.loans.items()) if loan["member_id"] == member_id]

    def pay_fine(self, member_id, amount):
        member = self.members.get(member_id)
        if member is None:
            raise KeyError(f"unknown member {member_id}")
        if amount <= 0 or amount > member["fines"] + 1e-9:
            raise ValueError(f"amount must be between 0 and {member['fines']:.2f}")
        member["fines"] = round(member["fines"] - amount, 2)
        return {"member_id": member_id, "fines": member["fines"]}
