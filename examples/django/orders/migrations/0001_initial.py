from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []  # noqa: RUF012 - Django's migration idiom

    operations = [  # noqa: RUF012
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("reference", models.CharField(max_length=64)),
                ("total_cents", models.PositiveIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="Shipment",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("label", models.CharField(max_length=200)),
                ("attempt", models.PositiveIntegerField()),
                ("order", models.OneToOneField(on_delete=models.deletion.CASCADE, to="orders.order")),
            ],
        ),
    ]
