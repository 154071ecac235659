import datetime


class ClinicScheduler:
    """Doctors with bookable slots, patients and their appointments."""

    def __init__(self, doctors=None, patients=None, appointments=None, next_id=100):
        self.doctors = dict(doctors or {})
        self.patients = dict(patients or {})
        self.appointments = dict(appointments or {})
        self.next_id = next_id

    def _taken(self, doctor_id, slot):
        return any(a["doctor_id"] == doctor_id and a["slot"] == slot and a["status"] == "booked"
                   for a in self.appointments.values())

    def list_doctors(self, specialty=None):
        return [{"doctor_id": d, "name": info["name"], "specialty": info["specialty"]}
                for d, info in sorted(self.doctors.items())
                if specialty is None or info["specialty"] == specialty]

    def get_available_slots(self, doctor_id, date=None):
        if doctor_id not in self.doctors:
            raise KeyError(f"unknown doctor {doctor_id}")
        slots = [s for s in self.doctors[doctor_id]["slots"] if not self._taken(doctor_id, s)]
        if date is not None:
            datetime.date.fromisoformat(date)
            slots = [s for s in slots if s.startswith(date)]
        return sorted(slots)

    def book_appointment(self, patient_id, doctor_id, slot):
        if patient_id not in self.patients:
            raise KeyError(f"unknown patient {patient_id}")
        if slot not in self.get_available_slots(doctor_id):
            raise ValueError(f"slot {slot} is not available for {doctor_id}")
        appointment_id = f"A{self.next_id}"
        self.next_id += 1
        self.appointments[appointment_id] = {"patient_id": patient_id, "doctor_id": doctor_id, "slot": slot,
                                             "status": "booked"}
        return {"appointment_id": appointment_id, "slot": slot}

    def cancel_appointment(self, appointment_id):
        appointment = self.appointments.get(appointment_id)
        if appointment is None or appointment["status"] != "booked":
            raise ValueError(f"no booked appointment {appointment_id}")
        appointment["status"] = "cancelled"
        return {"appointment_id": appointment_id, "status": "cancelled"}

    def reschedule_appointment(self, appointment_id, new_slot):
        appointment = self.appointments.get(appointment_id)
        if appointment is None or appointment["status"] != "booked":
            raise ValueError(f"no booked appointment {appointment_id}")
        if new_slot not in self.get_available_slots(appointment["doctor_id"]):
            raise ValueError(f"slot {new_slot} is not available")
        appointment["slot"] = new_slot
        return {"appointment_id": appointment_id, "slot": new_slot}

    def list_appointments(self, patient_id):
        return [{"appointment_id": a, **info} for a, info in sorted(self.appointments.items())
                if info["patient_id"] == patient_id]
