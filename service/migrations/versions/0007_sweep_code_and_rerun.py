"""sweeps.code (the code a sweep's latest attempt ran) and sweeps.rerun_of (the sweep it repeats)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 08:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("code", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("rerun_of", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("rerun_of")
        batch.drop_column("code")
