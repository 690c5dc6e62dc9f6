"""code_archives (the researcher's code a sweep brings, stored once per content) and sweeps.code_sha256

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 02:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_archives",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("uploaded_by", sa.String(100), nullable=True),
        sa.Column("uploaded_at", sa.DateTime(), nullable=False),
    )
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("code_sha256", sa.String(64), nullable=True))
        batch.create_foreign_key("fk_sweeps_code_sha256", "code_archives", ["code_sha256"], ["sha256"])


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_constraint("fk_sweeps_code_sha256", type_="foreignkey")
        batch.drop_column("code_sha256")
    op.drop_table("code_archives")
