"""/api/v1/proposals, /api/v1/reviews, /api/v1/trajectories/{id}/verdicts, /api/v1/review-assignments,
/api/v1/saved-views."""
from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.reviews.api import views

router = SimpleRouter(trailing_slash=False)
router.register("proposals", views.ProposalViewSet, basename="proposal")
router.register("reviews", views.ReviewViewSet, basename="review")
router.register("review-assignments", views.ReviewAssignmentViewSet, basename="review-assignment")
router.register("saved-views", views.SavedViewViewSet, basename="saved-view")

urlpatterns = [
    *router.urls,
    path("trajectories/<int:trajectory_id>/verdicts", views.VerdictView.as_view(), name="trajectory-verdict"),
]
