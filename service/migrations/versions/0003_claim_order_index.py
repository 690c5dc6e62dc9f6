"""index in the claim query's order

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 05:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_sweeps_claim_order", "sweeps", ["state", sa.text("priority DESC"), "submitted_at", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_sweeps_claim_order", table_name="sweeps")
