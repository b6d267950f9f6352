"""Data engines shared by packs: MLLM JSON reading, bad-sample policy, sharded sample storage."""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports


#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(('BadJSON', 'BadRecord', 'Columns', 'MLLMDataSection', 'PLACEHOLDERS', 'Sample', 'Turn', 'load_records', 'media_root', 'read_samples', 'resolve_media',), "mmcore.data.mllm"),
    **dict.fromkeys(('BadSample', 'BadSamples',), "mmcore.data.badsamples"),
    **dict.fromkeys(('CHATML_TEMPLATE', 'ChatMLEncoder', 'Encoded', 'Expander', 'IGNORE', 'Piece',), "mmcore.data.chatml"),
    **dict.fromkeys(('COLOURS', 'MOVES', 'PITCHES', 'SHAPES', 'SHAPE_TONE_QUESTION', 'SQUARE_COLOURS', 'TONE_RATE', 'moving_square', 'shape_image', 'tone_clip', 'write_moving_square_preferences', 'write_moving_squares', 'write_shape_preferences', 'write_shape_questions', 'write_shape_tone_questions',), "mmcore.data.synthetic"),
    **dict.fromkeys(('CachedSamples', 'FeatureCache', 'FeatureCacheWriter',), "mmcore.data.feature_cache"),
    **dict.fromkeys(('ChatTemplateEncoder', 'ChatTemplateError', 'PART_TYPES',), "mmcore.data.chat_template"),
    **dict.fromkeys(('DemoWriter', 'dataset_files', 'preprocess_conversations',), "mmcore.data.conversations"),
    **dict.fromkeys(('Failed', 'map_in_order',), "mmcore.data.workers"),
    **dict.fromkeys(('Fill', 'KINDS', 'append_fillers', 'encode_fillers', 'kinds_by_fields', 'kinds_in', 'write_filler_media',), "mmcore.data.fillers"),
    **dict.fromkeys(('MediaError', 'check_pixels', 'check_seconds', 'media_limits',), "mmcore.data.media"),
    **dict.fromkeys(('Probe', 'choose_bucket', 'contact_sheet', 'frames_at', 'load_image', 'probe', 'resize_crop', 'sample_frames', 'write_mp4',), "mmcore.data.video"),
    **dict.fromkeys(('ShardDataset', 'ShardWriter', 'held_out', 'split_key',), "mmcore.data.shards"),
    **dict.fromkeys(('load_audio', 'write_audio',), "mmcore.data.audio"),
    **dict.fromkeys(('preprocess_captioned_videos',), "mmcore.data.clips"),
    **dict.fromkeys(('read_captions',), "mmcore.data.captions"),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
