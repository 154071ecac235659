from django.apps import AppConfig
from django.db.models.signals import post_migrate

from apps.tasks.signals import iteration_finished


class ReviewsConfig(AppConfig):
    name = "apps.reviews"
    label = "reviews"

    def ready(self) -> None:
        from apps.reviews import jobs  # deferred: AppConfig.ready pattern (the receivers' module needs the models)
        from apps.reviews.models import Review  # deferred: AppConfig.ready pattern
        from apps.tasks import budgets  # deferred: AppConfig.ready pattern (it imports tasks' models)

        post_migrate.connect(jobs.register_review_schedules, sender=self, dispatch_uid="reviews.register_review_schedules")
        iteration_finished.connect(jobs.review_finished_iteration, dispatch_uid="reviews.review_finished_iteration")
        budgets.register_spend(Review, "trajectory")  # the judge's calls count against the budgets
