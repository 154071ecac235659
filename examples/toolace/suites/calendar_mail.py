class CalendarMail:
    """A work calendar with the company directory (names -> internal mailboxes) and an outbox."""

    def __init__(self, events=None, contacts=None, outbox=None, next_event=200, next_message=1):
        self.events = dict(events or {})
        self.contacts = dict(contacts or {})
        self.outbox = list(outbox or [])
        self.next_event = next_event
        self.next_message = next_message

    @staticmethod
    def _check_date(date):
        parts = date.split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or len(parts[0]) != 4:
            raise ValueError(f"date must be YYYY-MM-DD, got {date!r}")

    @staticmethod
    def _minutes(hhmm):
        hours, _, minutes = hhmm.partition(":")
        if not (hours.isdigit() and minutes.isdigit()) or int(hours) > 23 or int(minutes) > 59:
            raise ValueError(f"time must be HH:MM, got {hhmm!r}")
        return int(hours) * 60 + int(minutes)

    def list_events(self, date):
        self._check_date(date)
        found = [dict(event, event_id=eid) for eid, event in sorted(self.events.items()) if event["date"] == date]
        return sorted(found, key=lambda e: e["start"])

    def create_event(self, title, date, start, end, attendees=None):
        self._check_date(date)
        begin, finish = self._minutes(start), self._minutes(end)
        if finish <= begin:
            raise ValueError("end must be after start")
        for eid, event in self.events.items():
            if event["date"] == date and begin < self._minutes(event["end"]) and self._minutes(event["start"]) < finish:
                raise ValueError(f"conflicts with {eid} ({event['title']} {event['start']}-{event['end']})")
        for mailbox in attendees or []:
            if mailbox not in self.contacts.values():
                raise ValueError(f"attendee {mailbox!r} is not a mailbox of the directory")
        event_id = f"EV-{self.next_event}"
        self.next_event += 1
        self.events[event_id] = {"title": title, "date": date, "start": start, "end": end,
                                 "attendees": list(attendees or [])}
        return {"event_id": event_id, **self.events[event_id]}

    def cancel_event(self, event_id):
        if event_id not in self.events:
            raise KeyError(f"no event {event_id}")
        event = self.events.pop(event_id)
        return {"cancelled": event_id, "title": event["title"]}

    def find_contact(self, name):
        wanted = name.strip().lower()
        for contact, email in sorted(self.contacts.items()):
            if contact.lower() == wanted:
                return {"name": contact, "mailbox": email}
        raise KeyError(f"no contact named {name!r}")

    def send_email(self, to, subject, body=""):
        if to not in self.contacts.values():
            raise ValueError(f"{to!r} is not a mailbox of the directory")
        if not subject.strip():
            raise ValueError("the subject is empty")
        message_id = f"MSG-{self.next_message}"
        self.next_message += 1
        self.outbox.append({"message_id": message_id, "to": to, "subject": subject, "body": body})
        return {"message_id": message_id, "to": to, "status": "sent"}
