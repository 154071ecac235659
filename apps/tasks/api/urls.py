"""/api/v1/tasks, /api/v1/batches, /api/v1/trajectories."""
from rest_framework.routers import SimpleRouter

from apps.tasks.api import views

router = SimpleRouter(trailing_slash=False)
router.register("tasks", views.TaskViewSet, basename="task")
router.register("batches", views.BatchViewSet, basename="batch")
router.register("trajectories", views.TrajectoryViewSet, basename="trajectory")

urlpatterns = router.urls
