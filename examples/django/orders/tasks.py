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


def _slow_partner() -> None:
    """A slow partner system: in the tests, long enough to lose the lease."""
    pause = float(os.environ.get("SHOP_PARTNER_PAUSE", "0"))
    if pause:
        time.sleep(pause)


@task
def import_order(reference: str, total_cents: int) -> int:
    """Import an order from a partner: the Order row commits with the job's
    completion, or (an attempt that lost its job meanwhile) not at all."""
    _slow_partner()
    with fenced():
        order = Order.objects.create(reference=reference, total_cents=total_cents)
    return order.pk


@task
def import_order_then_report(reference: str, total_cents: int, report_seconds: float) -> int:
    """import_order, then a report that takes a while after the fenced block
    committed: the task's result is written only when it returns."""
    with fenced():
        order = Order.objects.create(reference=reference, total_cents=total_cents)
    time.sleep(report_seconds)
    return order.pk


@task
def ship(order_id: int) -> dict:
    """Record the order's shipment, fenced like import_order."""
    job = current_job()
    assert job is not None
    label = f"label-{order_id}"
    with fenced():
        Shipment.objects.create(order=Order.objects.get(pk=order_id), label=label, attempt=job.attempt)
    return {"order": order_id, "label": label}


@task
def noop() -> None:
    return None


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
