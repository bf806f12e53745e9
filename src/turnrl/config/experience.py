"""The ``experience`` config section: the experience library (past steps retrieved into the observation) and the
skill library (action sequences of successful episodes offered as ``skill NAME``); ``docs/experience.md``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnrl.config.section import Section


class ExperienceConfig(Section):
    retrieve: bool = Field(
        False, description="experience library: store every trained turn (state key, action, reward, episode success, "
        "advantage) after credit, and append the nearest stored records to each observation"
    )
    key: Literal["anchor", "situation", "observation"] = Field(
        "anchor", description="what a record is stored and looked up under: the env's anchor state (GiGPO's key), its "
        "situation (what the agent faces in terms that recur across tasks, e.g. FrozenLake's neighbour cells and goal "
        "direction) or the observation text"
    )
    top_k: int = Field(3, ge=1, description="records retrieved per observation: exact key matches first, then the "
                                            "most similar keys")
    min_similarity: float = Field(
        0.5, ge=0.0, le=1.0, description="smallest token-set Jaccard similarity (words and word pairs) of a stored "
        "key to the current one for its records to be retrieved when exact matches are too few; 1 = exact only"
    )
    max_records: int = Field(2048, ge=1, description="records kept; past it the oldest are evicted first")
    max_age: int = Field(
        4, ge=1, description="policy versions a record (or a skill's evidence) stays usable: what was sampled more "
        "than this many weight syncs before the current policy is dropped"
    )
    skills: bool = Field(
        False, description="skill library: extract frequent action sequences of successful episodes and offer them "
        "as 'skill NAME' responses that run the sequence on the env"
    )
    max_skills: int = Field(4, ge=1, description="skills offered at most (the most frequent)")
    skill_min_length: int = Field(2, ge=2, description="fewest actions in a skill")
    skill_max_length: int = Field(4, ge=2, description="most actions in a skill")
    skill_min_count: int = Field(2, ge=1, description="successful episodes that must contain a sequence before it "
                                                      "becomes a skill")

    @model_validator(mode="after")
    def _lengths(self) -> "ExperienceConfig":
        if self.skill_min_length > self.skill_max_length:
            raise ValueError(f"experience.skill_min_length={self.skill_min_length} is above experience.skill_max_length="
                             f"{self.skill_max_length}: set skill_max_length >= skill_min_length")
        return self
