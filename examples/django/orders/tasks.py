"""The shop's tasks, on pgfence."""

import asyncio
import os
import time

from pgfence.contrib.django import afenced, current_job, fenced

try:
    from django.tasks import TaskContext, task
except ImportError:          # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task

from orders.models import Order, Shipment


@task
def ship(order_id: int) -> dict:
    """Record the order's shipment: the write commits with the job's
    completion, or (a stale attempt) not at all."""
    job = current_job()
    assert job is not None
    pause = float(os.environ.get("SHOP_SHIP_PAUSE", "0"))
    if pause:
        time.sleep(pause)    # a slow carrier: long enough, in the tests, to lose the lease
    label = f"label-{order_id}"
    with fenced():
        Shipment.objects.create(order=Order.objects.get(pk=order_id), label=label, attempt=job.attempt)
    return {"order": order_id, "label": label}


@task(priority=10, queue_name="mail")
def receipt(order_id: int) -> str:
    return f"receipt for order {order_id}"


@task(queue_name="mail")
def log_reference(reference: str) -> str:
    return reference


@task
def declined(order_id: int) -> None:
    raise ValueError(f"card declined for order {order_id}")


@task(takes_context=True)
def attempt_number(context: TaskContext) -> int:
    return context.attempt


def _count_orders() -> int:
    return Order.objects.count()


@task
async def count_orders_later(delay: float) -> int:
    await asyncio.sleep(delay)
    return await afenced(_count_orders)
