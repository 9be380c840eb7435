"""turns: the tokens of each model turn of an agent trajectory

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 06:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "turns",
        sa.Column("trajectory_key", sa.String(length=300), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("input_ids", sa.Text(), nullable=False),
        sa.Column("output_ids", sa.Text(), nullable=False),
        sa.Column("output_logprobs", sa.Text(), nullable=False),
        sa.Column("weight_version", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(["trajectory_key"], ["trajectories.key"]),
        sa.PrimaryKeyConstraint("trajectory_key", "step_index"),
    )


def downgrade() -> None:
    op.drop_table("turns")
