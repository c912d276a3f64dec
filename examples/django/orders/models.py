"""The shop's one model: an order, and the shipment a task records for it."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64)
    total_cents = models.PositiveIntegerField()


class Shipment(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    label = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
