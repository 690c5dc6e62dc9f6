"""routing: what each sweep's trials need of a Ray cluster, and the workers' heartbeat rows

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 12:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("need_cpus", sa.Float(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("need_gpus", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("need_workers", sa.Integer(), nullable=False, server_default="1"))
    # Sweeps queued before this revision: their needs from their spec's resources, as service.routing.Need
    # reads them (written out here: a migration must not change when the code does).
    bind = op.get_bind()
    sweeps = sa.table(
        "sweeps",
        sa.column("id", sa.Integer()),
        sa.column("spec", sa.JSON()),
        sa.column("need_cpus", sa.Float()),
        sa.column("need_gpus", sa.Float()),
        sa.column("need_workers", sa.Integer()),
    )
    for sweep_id, spec in bind.execute(sa.select(sweeps.c.id, sweeps.c.spec)).all():
        res = (spec or {}).get("resources") or {}
        cpus, gpus, workers = float(res.get("cpus", 1.0)), float(res.get("gpus", 0.0)), int(res.get("workers", 1))
        bundle_gpus = gpus / workers if (workers > 1 or gpus > 0) else gpus
        bind.execute(
            sweeps.update()
            .where(sweeps.c.id == sweep_id)
            .values(need_cpus=cpus, need_gpus=bundle_gpus, need_workers=workers)
        )
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_workers_seen_at", "workers", ["seen_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_workers_seen_at", table_name="workers")
    op.drop_table("workers")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("need_workers")
        batch.drop_column("need_gpus")
        batch.drop_column("need_cpus")
